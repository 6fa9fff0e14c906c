"""Generated protobuf and gRPC modules for the Open Inference Protocol; never edit by hand.

``grpc_service.proto`` is the source. ``python scripts/gen_proto.py`` regenerates
``grpc_service_pb2.py`` (messages), ``grpc_service_pb2.pyi`` (their types) and
``grpc_service_pb2_grpc.py`` (service stub and registration); a test checks that the
committed files are exactly what the script writes.
"""
