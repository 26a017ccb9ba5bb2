"""A small OpenAI-compatible edge proxy that routes with router_client (an example)."""
