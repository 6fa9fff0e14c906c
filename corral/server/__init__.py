"""The servers: HTTP (ASGI), gRPC, metrics and the wiring that runs them."""
