//! rlx-compile
