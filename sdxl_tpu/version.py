"""The project's version, as the parameters written into every image name it ("Version: ...")."""

VERSION = "0.1.0"
