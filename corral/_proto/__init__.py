"""Generated protobuf module for Triton's model configuration; never edit by hand.

``model_config.proto`` is the source; ``make proto`` (``scripts/gen_proto.py`` with the
grpcio-tools of constraints/proto.txt) regenerates ``model_config_pb2.py`` and ``.pyi`` (a test
checks the committed files are what it writes).
It lives beside the core because the core reads ``config.pbtxt`` with it
(``corral._models.pbtxt.parse``), importing it lazily: protobuf is loaded only when a model folder
holds a config.pbtxt. The gRPC service (``corral.protocol.proto``) imports it too, and adds its own
file to this module's descriptor pool.
"""
