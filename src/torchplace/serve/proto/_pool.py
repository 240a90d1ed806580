"""torchplace's own protobuf descriptor pool for the gRPC protocol's messages.

Not protobuf's default pool: a process that also imports another copy of the same protocol
(``tritonclient.grpc``'s) would see two definitions of ``inference.ModelInferRequest`` there.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
