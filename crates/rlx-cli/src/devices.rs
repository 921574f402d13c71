//! `rlx devices`: every device type this build knows, whether it is live here, and why not.

use clap::Args;
use rlx_runtime::{backend, Device};

/// List the devices: live ones with what they are, absent ones with the reason.
#[derive(Args, Debug, Clone)]
pub struct DevicesArgs {
    /// Print JSON (`[{"device": "cuda", "live": false, "detail": "..."}]`).
    #[arg(long)]
    pub json: bool,
}

/// One line per device type: `cpu    live    cpu (16 threads)` or
/// `cuda   absent  libcuda.so.1 not found (searched ...)`.
pub fn render(devices: &[(Device, Result<String, String>)]) -> String {
    let mut s = String::new();
    for (d, r) in devices {
        let (state, detail) = match r {
            Ok(x) => ("live", x.as_str()),
            Err(e) => ("absent", e.as_str()),
        };
        s.push_str(&format!("{:<6} {state:<7} {detail}\n", d.to_string()));
    }
    s
}

/// `rlx devices`; exit 0.
pub fn main_devices(a: DevicesArgs) -> i32 {
    let all: Vec<(Device, Result<String, String>)> = [Device::Cpu, Device::Wgpu, Device::Cuda]
        .into_iter()
        .map(|d| (d, backend::probe(d)))
        .collect();
    if a.json {
        let v: Vec<serde_json::Value> = all
            .iter()
            .map(|(d, r)| {
                serde_json::json!({
                    "device": d.to_string(),
                    "live": r.is_ok(),
                    "detail": match r { Ok(x) | Err(x) => x },
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
    } else {
        print!("{}", render(&all));
    }
    0
}
