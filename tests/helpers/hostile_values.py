"""Values a field of each kind never takes, for the fuzz tests of the routes that take JSON."""

NOT_JSON = [b"", b"{", b"[", b"null", b"[]", b'"x"', b"1", b"\xff\xfe\x00", b"{" * 5000 + b"}" * 5000,
            b"[" * 100_000, b'{"prompt": "x"', b'{"prompt": "x",}', b"{'prompt': 'x'}", b'{"prompt": NaN', b"\x00" * 9]
# Per kind, values a field of that kind never takes (json.dumps writes NaN and Infinity as Python reads them).
NOT_TEXT = [5, 1.5, True, {"$ne": ""}, [["x"]], [], {}, -1, 1e308]
NOT_NUMBER = ["5", "x", "../../etc/passwd", "", True, {"a": 1}, [1], [], float("nan"), float("inf"), -float("inf"),
              10**30, -10**30]
NOT_BOOL = ["yes", 2, 1.5, {"a": 1}, [True], "", -1]
NOT_CHOICE = ["nope", "../../etc/passwd", "\x00", "x" * 10_000, "%00", "<script>alert(1)</script>", *NOT_TEXT]
# What no field of the form takes (its MCP tool's arguments): objects, nested lists, files it did not write.
NOT_ANY = [{"$ne": 1}, [[1]], [1, "x"], 1e308, -1e308, {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}},
           {"path": "http://127.0.0.1:1/x.png"}, {"url": "file:///etc/passwd"}]
