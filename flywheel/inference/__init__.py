"""Serving: the gateway's backends (OpenAI-compatible upstreams, the local transformers + peft
server), routing of a request's `model` to a version, and the recording of every call."""
