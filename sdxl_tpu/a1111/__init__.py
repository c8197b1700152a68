"""AUTOMATIC1111's formats, in plain Python: its prompts (emphasis, BREAK, 75-token chunks), its
parameters text (infotext) written and read, images carrying it, PNG Info, and its web API's bodies."""
