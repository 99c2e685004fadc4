//! End-to-end tests for reqwest-conntrace and the `conntrace` CLI live in
//! `e2e/` (one test binary); this library is empty.
