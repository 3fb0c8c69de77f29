"""Generation: the JAX engine, the SGLang-compatible server and clients."""
