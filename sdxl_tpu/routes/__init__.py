"""What a server answers over HTTP besides the page: the back end's JSON routes (backend.py), AUTOMATIC1111's
and OpenAI's APIs and the key they take (tool_apis.py; a request for many images split into calls:
many_images.py), and the request guard in front of Gradio (guard.py);
Gradio's and uvicorn's internals in one place (internals.py)."""
