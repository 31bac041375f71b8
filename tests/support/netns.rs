//! Network namespace fixtures (owned by the namespace tests).
