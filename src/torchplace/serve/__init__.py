"""``torchplace serve``: a model behind the Open Inference Protocol (KServe v2 REST).

Modules: ``config`` (ServeConfig), ``protocol`` (the OIP codec), ``http`` and ``app`` (the
server and its routes), ``engine`` (replicas, batcher, failures, metrics, tracing), ``cli``.
Nothing is imported here, so ``import torchplace.serve`` stays cheap.
"""

__all__: list[str] = []
