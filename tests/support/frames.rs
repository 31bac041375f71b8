//! Frame builders (owned by the test-run tests).
