//! The `rlx` command-line tool. `rlx run` runs a model and localizes NaN/Inf; `rlx lint`
//! proves constants non-finite before anything runs. `rlx-run` is `rlx run`.

pub mod npy;
pub mod run;
