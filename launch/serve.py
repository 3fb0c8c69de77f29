"""Serve a Qwen3 HF folder over the SGLang-compatible HTTP API with the JAX engine.

    python -m launch.serve --model runs/tiny-qwen3 --port 30000
"""

import logging

import sys

from hljax import preflight
from launch.common import ArgumentParser, setup_logging, start_up


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF checkpoint folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--context-length", "--max-seq-len", dest="context_length", type=int, default=None,
                        help="prompt + completion tokens per request (SGLang's flag); default and cap: the "
                             "model's max_position_embeddings. Longer requests get a 400 naming both numbers.")
    parser.add_argument("--decode-chunk", type=int, default=16,
                        help="decode steps between the points where new requests join the running batch")
    parser.add_argument("--tensor", type=int, default=1, help="tensor-parallel degree (rest goes to fsdp)")
    args = parser.parse_args()
    with start_up(args.verbose):
        checked = preflight.serve(args.model, args.host, args.port)
    # JAX and the engine load only once the folder and the port are known good.
    import jax.numpy as jnp

    from hljax import sharding as shd
    from hljax.generate.engine import EngineConfig
    from hljax.generate.local import LocalGenerator
    from hljax.generate.server import Server
    from hljax.mesh import MeshConfig

    setup_logging()
    logging.info("preflight passed: %s", ", ".join(checked))
    mesh = shd.make_mesh(MeshConfig(data=1, fsdp=-1, tensor=args.tensor))
    config = EngineConfig(max_batch=args.max_batch, max_seq_len=args.context_length, decode_chunk=args.decode_chunk)
    generator = LocalGenerator.from_pretrained(args.model, mesh, config, dtype=getattr(jnp, args.dtype))
    server = Server(generator, args.model, args.host, args.port, server_args={
        "dtype": args.dtype, "max_running_requests": args.max_batch, "tp_size": args.tensor,
        "decode_chunk": args.decode_chunk})
    logging.info("serving %s at %s (context length %d)", args.model, server.url, generator.engine.context_length)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C is how a foreground server is stopped: no traceback for it.
        print(f"\n== stopped == {server.url}", flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
