"""Running untrusted harness code: `sandbox.pool.SandboxPool` and its configs.

Deliberately empty: the modules that run inside the sandbox (`worker`, `runner`, `jail`,
`protocol`) are imported there from a read-only copy of this package, where hljax and its
dependencies do not exist, so importing the package must not pull in the supervisor side.
"""
