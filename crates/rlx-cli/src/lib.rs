//! The `rlx` command-line tool. `rlx run` runs a model and localizes NaN/Inf; `rlx lint`
//! proves constants non-finite before anything runs. `rlx-run` is `rlx run`.

pub mod compile;
pub mod diverge;
pub mod env_cmd;
pub mod load;
pub mod npy;
pub mod run;
pub mod trace;
