//! Runnable examples for reqwest-conntrace: see the `examples/` files.
