//! The whole suite: find the cases, run each in a child process with a time limit, aggregate,
//! print the per-op table, gate on the manifest of cases expected to pass.

use crate::case::{self, DebugOutcome, Line, Outcome, RunPath, Stage, LINE_PREFIX};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The op types issue 3 asks to cover first (what real CNNs and transformers use).
pub const PRIORITY_OPS: &[&str] = &[
    "Conv",
    "ConvTranspose",
    "Gemm",
    "MatMul",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Neg",
    "Abs",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Log",
    "Tanh",
    "Sigmoid",
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Erf",
    "Sin",
    "Cos",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Min",
    "Max",
    "Mean",
    "Sum",
    "Mod",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
    "Not",
    "IsNaN",
    "IsInf",
    "Cast",
    "CastLike",
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "Softmax",
    "LogSoftmax",
    "Hardmax",
    "LayerNormalization",
    "BatchNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "RMSNormalization",
    "Attention",
    "RotaryEmbedding",
    "Gelu",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "LpPool",
    "GlobalLpPool",
    "Resize",
    "Pad",
    "Slice",
    "Gather",
    "GatherElements",
    "GatherND",
    "Scatter",
    "ScatterElements",
    "ScatterND",
    "Where",
    "Expand",
    "Tile",
    "Concat",
    "Split",
    "Transpose",
    "Reshape",
    "Squeeze",
    "Unsqueeze",
    "Shape",
    "Size",
    "Range",
    "CumSum",
    "TopK",
    "ArgMax",
    "ArgMin",
    "Einsum",
    "Trilu",
    "OneHot",
    "NonZero",
    "Clip",
    "DequantizeLinear",
    "QuantizeLinear",
    "If",
    "Loop",
    "Identity",
    "Flatten",
    "HardSigmoid",
    "HardSwish",
    "Softplus",
    "Softsign",
    "PRelu",
    "Mish",
    "Celu",
    "ThresholdedRelu",
];

/// How to run the suite.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Folder holding one folder per case (`fixtures/onnx-node`).
    pub root: PathBuf,
    /// The `rlx-conformance` binary (re-invoked as `rlx-conformance case DIR` per case).
    pub exe: PathBuf,
    /// Cases run at once.
    pub jobs: usize,
    /// Wall-clock limit per case (both runs of it).
    pub timeout: Duration,
    /// Only cases whose name contains this string (the others count as skipped).
    pub filter: Option<String>,
    /// Also run each case with the localizer on and check it changes nothing.
    pub debug_nans: bool,
    /// Print a progress line to stderr every this many cases (0: never).
    pub progress_every: usize,
}

impl SuiteOptions {
    /// Defaults, overridable by environment: `RLX_CONFORMANCE_JOBS` (default: 2, at most the
    /// machine's cores), `RLX_CONFORMANCE_TIMEOUT_S` (10), `RLX_CONFORMANCE_FILTER`,
    /// `RLX_CONFORMANCE_DEBUG_NANS=0` (skip the localizer run).
    ///
    /// Panics when `RLX_CONFORMANCE_TIMEOUT_S` is not a valid limit ([`parse_timeout`]); see
    /// [`SuiteOptions::try_from_env`].
    pub fn from_env(root: PathBuf, exe: PathBuf) -> SuiteOptions {
        Self::try_from_env(root, exe).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`SuiteOptions::from_env`], with an invalid `RLX_CONFORMANCE_TIMEOUT_S` as an error.
    pub fn try_from_env(root: PathBuf, exe: PathBuf) -> Result<SuiteOptions, String> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let env = |k: &str| rlx_ir::env::get(k).filter(|v| !v.is_empty());
        let timeout = match env("RLX_CONFORMANCE_TIMEOUT_S") {
            Some(v) => parse_timeout(&v).map_err(|e| format!("RLX_CONFORMANCE_TIMEOUT_S: {e}"))?,
            None => Duration::from_secs(10),
        };
        Ok(SuiteOptions {
            root,
            exe,
            jobs: env("RLX_CONFORMANCE_JOBS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(2.min(cores))
                .max(1),
            timeout,
            filter: env("RLX_CONFORMANCE_FILTER"),
            debug_nans: !rlx_ir::env::is_off("RLX_CONFORMANCE_DEBUG_NANS"),
            progress_every: 500,
        })
    }
}

/// The longest per-case limit accepted (one day).
pub const MAX_TIMEOUT_S: f64 = 86_400.0;

/// A per-case time limit in seconds: finite, positive, at most [`MAX_TIMEOUT_S`].
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 || v > MAX_TIMEOUT_S {
        return Err(format!(
            "{s:?}: the time limit must be a finite number of seconds, > 0 and <= {MAX_TIMEOUT_S} (one day)"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

/// One case's result.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub name: String,
    /// The op type the case tests: the node's op type, or for `*_expanded*` cases the op type
    /// of the case they expand.
    pub op: String,
    pub expanded: bool,
    pub outcome: Outcome,
    /// The localizer run (None when it did not happen: the model did not compile, or the
    /// suite ran without it).
    pub debug: Option<DebugOutcome>,
    /// The child died or timed out during the localizer run (after the plain run finished).
    pub debug_crash: Option<String>,
    /// onnxruntime's status on this case (`pass`, `fail`, `error`, ...), when known.
    pub ort: Option<String>,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.outcome.passed()
    }
    pub fn ort_passed(&self) -> bool {
        self.ort.as_deref() == Some("pass")
    }
    /// The localizer changed an output, failed where the plain run did not, or crashed.
    pub fn debug_violation(&self) -> Option<String> {
        if let Some(c) = &self.debug_crash {
            return Some(c.clone());
        }
        match &self.debug {
            Some(d) if !d.same => Some(d.detail.clone()),
            _ => None,
        }
    }
}

/// All results of one suite run.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteReport {
    pub root: PathBuf,
    pub results: Vec<CaseResult>,
    /// Cases present but filtered out.
    pub skipped: usize,
    pub wall_s: f64,
    pub jobs: usize,
    pub debug_nans: bool,
    pub onnxruntime: Option<String>,
}

impl SuiteReport {
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.passed()).count()
    }
    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }
    /// Passing cases by how they ran ([`Outcome::run_path`]): `(static, planned by the
    /// value of a parameter input, in segments around a value-dependent node)`.
    pub fn passed_by_path(&self) -> (usize, usize, usize) {
        let n = |p: RunPath| {
            self.results
                .iter()
                .filter(|c| c.passed() && c.outcome.run_path == p)
                .count()
        };
        (
            n(RunPath::Static),
            n(RunPath::ByValue),
            n(RunPath::Segments),
        )
    }
    /// `N passed, M failed (S skipped)`.
    pub fn closing_line(&self) -> String {
        format!(
            "{} passed, {} failed ({} skipped)",
            self.passed(),
            self.failed(),
            self.skipped
        )
    }
}

/// Case folders (those holding `model.onnx`) under `root`, sorted by name.
pub fn discover(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("model.onnx").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The base case of an expanded one (`test_x_expanded_ver18` → `test_x`).
pub fn base_case(name: &str) -> &str {
    name.find("_expanded").map_or(name, |k| &name[..k])
}

/// onnxruntime's status per case from `ROOT/ort_results.json` (written by
/// `scripts/onnx-node-suite`), and its version.
pub fn load_ort(root: &Path) -> Option<(String, HashMap<String, String>)> {
    let text = std::fs::read_to_string(root.join("ort_results.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let ver = v.get("onnxruntime")?.as_str()?.to_string();
    let cases = v.get("cases")?.as_object()?;
    Some((
        ver,
        cases
            .iter()
            .filter_map(|(k, c)| Some((k.clone(), c.get("status")?.as_str()?.to_string())))
            .collect(),
    ))
}

/// Run one case in a child process with a time limit.
fn run_child(
    opts: &SuiteOptions,
    dir: &Path,
) -> (
    Option<Outcome>,
    Option<DebugOutcome>,
    Option<(Stage, String)>,
) {
    let mut cmd = Command::new(&opts.exe);
    cmd.arg("case").arg(dir);
    if opts.debug_nans {
        cmd.arg("--debug-nans");
    }
    cmd.env_remove("RLX_DEBUG_NANS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        cmd.env("RAYON_NUM_THREADS", "1");
    }
    #[cfg(unix)]
    {
        // Own process group, so a timeout kills whatever the case started too.
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return (
                None,
                None,
                Some((
                    Stage::Load,
                    format!("cannot start {}: {e}", opts.exe.display()),
                )),
            )
        }
    };
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    // Readers hand their bytes over a channel, so a pipe held open by a stray grandchild
    // cannot block the suite.
    let (tx_out, rx_out) = std::sync::mpsc::channel();
    let (tx_err, rx_err) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut b = vec![];
        let _ = out.read_to_end(&mut b);
        let _ = tx_out.send(b);
    });
    std::thread::spawn(move || {
        let mut b = vec![];
        let _ = err.read_to_end(&mut b);
        let _ = tx_err.send(b);
    });
    let start = Instant::now();
    let mut nap = Duration::from_micros(500);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() >= opts.timeout => {
                #[cfg(unix)]
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .stderr(Stdio::null())
                    .status();
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(20));
            }
            Err(_) => break None,
        }
    };
    let grace = Duration::from_secs(2);
    let stdout =
        String::from_utf8_lossy(&rx_out.recv_timeout(grace).unwrap_or_default()).into_owned();
    let stderr =
        String::from_utf8_lossy(&rx_err.recv_timeout(grace).unwrap_or_default()).into_owned();
    let mut normal = None;
    let mut debug = None;
    for l in stdout.lines() {
        if let Some(j) = l.strip_prefix(LINE_PREFIX) {
            match serde_json::from_str::<Line>(j) {
                Ok(Line::Normal(o)) => normal = Some(o),
                Ok(Line::Debug(d)) => debug = Some(d),
                Err(_) => {}
            }
        }
    }
    let problem = match status {
        None => Some((
            Stage::Timeout,
            format!(
                "no result within {:.0} s (killed)",
                opts.timeout.as_secs_f64()
            ),
        )),
        Some(s) if s.success() => None,
        // The case ran and reported that it did not pass.
        Some(s) if s.code() == Some(i32::from(case::EXIT_NOT_PASSED)) && normal.is_some() => None,
        Some(s) => Some((
            Stage::Crash,
            format!("{}{}", exit_text(s), stderr_tail(&stderr)),
        )),
    };
    (normal, debug, problem)
}

fn exit_text(s: std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = s.signal() {
            let name = match sig {
                4 => "SIGILL",
                6 => "SIGABRT",
                7 => "SIGBUS",
                8 => "SIGFPE",
                9 => "SIGKILL",
                11 => "SIGSEGV",
                _ => "signal",
            };
            return format!("killed by {name} ({sig})");
        }
    }
    format!("exit status {}", s.code().unwrap_or(-1))
}

fn stderr_tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = lines[lines.len().saturating_sub(2)..].join(" | ");
    format!(": {}", truncate(&tail, 300))
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

/// Run every case under `opts.root`.
pub fn run_suite(opts: &SuiteOptions) -> SuiteReport {
    let t0 = Instant::now();
    let all = discover(&opts.root);
    let names: Vec<String> = match &opts.filter {
        Some(f) => all
            .iter()
            .filter(|n| n.contains(f.as_str()))
            .cloned()
            .collect(),
        None => all.clone(),
    };
    let skipped = all.len() - names.len();
    // Op type per case: the first node's op of the (base) case.
    let first_op = |name: &str| -> Option<String> {
        let m = case::load_meta(&opts.root.join(name)).ok()?;
        m.nodes.first().map(|n| n.op_type.clone())
    };
    let ort = load_ort(&opts.root);
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<CaseResult>>> = Mutex::new(vec![None; names.len()]);
    std::thread::scope(|s| {
        for _ in 0..opts.jobs.max(1) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                if k >= names.len() {
                    break;
                }
                let name = &names[k];
                let dir = opts.root.join(name);
                let base = base_case(name);
                let op = (if base != name { first_op(base) } else { None })
                    .or_else(|| first_op(name))
                    .unwrap_or_else(|| "(unknown)".into());
                let (normal, debug, problem) = run_child(opts, &dir);
                let (outcome, debug_crash) = match (normal, problem) {
                    (Some(o), None) => (o, None),
                    (Some(o), Some((st, d))) => (
                        o,
                        Some(format!("{} during the localizer run: {d}", st.as_str())),
                    ),
                    (None, Some((st, d))) => (
                        Outcome {
                            stage: st,
                            detail: d,
                            ms: 0.0,
                            expected_nonfinite: false,
                            run_path: RunPath::Static,
                        },
                        None,
                    ),
                    (None, None) => (
                        Outcome {
                            stage: Stage::Crash,
                            detail: "the child printed no result".into(),
                            ms: 0.0,
                            expected_nonfinite: false,
                            run_path: RunPath::Static,
                        },
                        None,
                    ),
                };
                let r = CaseResult {
                    name: name.clone(),
                    op,
                    expanded: name.contains("_expanded"),
                    outcome,
                    debug,
                    debug_crash,
                    ort: ort.as_ref().and_then(|(_, m)| m.get(name).cloned()),
                };
                slots.lock().unwrap()[k] = Some(r);
                let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                if opts.progress_every > 0 && n.is_multiple_of(opts.progress_every) {
                    eprint_now(&format!(
                        "rlx-conformance: {n}/{} cases ({:.0} s)\n",
                        names.len(),
                        t0.elapsed().as_secs_f64()
                    ));
                }
            });
        }
    });
    let results: Vec<CaseResult> = slots.into_inner().unwrap().into_iter().flatten().collect();
    SuiteReport {
        root: opts.root.clone(),
        results,
        skipped,
        wall_s: t0.elapsed().as_secs_f64(),
        jobs: opts.jobs,
        debug_nans: opts.debug_nans,
        onnxruntime: ort.map(|(v, _)| v),
    }
}

/// Write to the process's stderr directly (not through the test harness's capture).
pub fn eprint_now(s: &str) {
    use std::io::Write;
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(s.as_bytes());
    let _ = e.flush();
}

/// A failure's class: stage plus the message with names and numbers taken out, so that
/// failures with one cause group together.
pub fn failure_class(o: &Outcome) -> String {
    let d = o.detail.as_str();
    let d = match d.find(": ") {
        Some(k) if d.starts_with("test_data_set_") => &d[k + 2..],
        _ => d,
    };
    if let Some(k) = d.find("unsupported op ") {
        let rest = &d[k + "unsupported op ".len()..];
        let op = rest.split_whitespace().next().unwrap_or(rest);
        return format!("import: unsupported op {op}");
    }
    if o.stage == Stage::Compare {
        if d.contains("elements differ") {
            return "compare: wrong values".into();
        }
        if let Some(k) = d.find("dtype ") {
            return format!("compare: {}", &d[k..]);
        }
        if d.contains("dims ") {
            return "compare: wrong dims".into();
        }
    }
    // Quoted names → "…", free-standing digit runs → N (digits inside a word such as
    // UINT16 or ReduceL1 stay).
    let mut s = String::new();
    let mut in_q = false;
    let mut prev_digit = false;
    let mut prev_alnum = false;
    for c in d.chars() {
        let was_alnum = prev_alnum;
        prev_alnum = c.is_ascii_alphanumeric() || c == '_';
        if c == '"' {
            if !in_q {
                s.push_str("\"…\"");
            }
            in_q = !in_q;
            continue;
        }
        if in_q {
            continue;
        }
        if c.is_ascii_digit() && (prev_digit || !was_alnum) {
            if !prev_digit {
                s.push('N');
            }
            prev_digit = true;
            continue;
        }
        prev_digit = false;
        s.push(c);
    }
    format!("{}: {}", o.stage.as_str(), truncate(&s, 110))
}

/// The per-op table: one row per op type, most failures first.
pub fn op_table(r: &SuiteReport) -> String {
    #[derive(Default)]
    struct Row {
        cases: usize,
        pass: usize,
        exp_cases: usize,
        exp_pass: usize,
        ort_pass: usize,
        rlx_only: usize,
        classes: BTreeMap<String, usize>,
    }
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    for c in &r.results {
        let row = rows.entry(c.op.as_str()).or_default();
        row.cases += 1;
        if c.expanded {
            row.exp_cases += 1;
        }
        if c.passed() {
            row.pass += 1;
            if c.expanded {
                row.exp_pass += 1;
            }
            if !c.ort_passed() && c.ort.is_some() {
                row.rlx_only += 1;
            }
        } else {
            *row.classes.entry(failure_class(&c.outcome)).or_default() += 1;
        }
        if c.ort_passed() {
            row.ort_pass += 1;
        }
    }
    let mut v: Vec<(&str, Row)> = rows.into_iter().collect();
    v.sort_by(|a, b| {
        (b.1.cases - b.1.pass)
            .cmp(&(a.1.cases - a.1.pass))
            .then(a.0.cmp(b.0))
    });
    let w = v.iter().map(|(k, _)| k.len()).max().unwrap_or(2).max(2);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:w$}  {:>5} {:>5} {:>5} {:>9} {:>5} {:>7}  most common failure",
        "op", "cases", "pass", "fail", "expanded", "ort", "rlx>ort"
    );
    for (op, row) in &v {
        let top = row
            .classes
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(k, n)| format!("{k} ({n})"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "{op:w$}  {:>5} {:>5} {:>5} {:>9} {:>5} {:>7}  {top}",
            row.cases,
            row.pass,
            row.cases - row.pass,
            format!("{}/{}", row.exp_pass, row.exp_cases),
            row.ort_pass,
            row.rlx_only
        );
    }
    s
}

/// The most common failure classes over all cases, with an example case each.
pub fn failure_classes(r: &SuiteReport, top: usize) -> String {
    let mut m: BTreeMap<String, (usize, &str)> = BTreeMap::new();
    for c in r.results.iter().filter(|c| !c.passed()) {
        let e = m
            .entry(failure_class(&c.outcome))
            .or_insert((0, c.name.as_str()));
        e.0 += 1;
    }
    let mut v: Vec<_> = m.into_iter().collect();
    v.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    let mut s = String::new();
    for (k, (n, ex)) in v.iter().take(top) {
        let _ = writeln!(s, "{n:5}  {k}   (e.g. {ex})");
    }
    if v.len() > top {
        let rest: usize = v[top..].iter().map(|x| x.1 .0).sum();
        let _ = writeln!(s, "{rest:5}  ({} more classes)", v.len() - top);
    }
    s
}

/// Read a manifest: one case name per line; `#` starts a comment. A missing file reads as
/// empty.
pub fn read_manifest(path: &Path) -> std::io::Result<BTreeSet<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .map(|l| l.split_once('#').map_or(l, |(name, _)| name).trim())
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect())
}

/// What rewriting the manifest from a run would do.
#[derive(Debug, Clone, Default)]
pub struct ManifestPlan {
    /// The new manifest: every passing case.
    pub cases: BTreeSet<String>,
    /// Passing cases the manifest does not list yet.
    pub added: Vec<String>,
    /// Listed cases that would go (they failed, or are not in the run).
    pub removed: Vec<String>,
}

/// The manifest a run gives (its passing cases), against the current one.
pub fn plan_manifest(r: &SuiteReport, current: &BTreeSet<String>) -> ManifestPlan {
    let cases: BTreeSet<String> = r
        .results
        .iter()
        .filter(|c| c.passed())
        .map(|c| c.name.clone())
        .collect();
    let added = cases.difference(current).cloned().collect();
    let removed = current.difference(&cases).cloned().collect();
    ManifestPlan {
        cases,
        added,
        removed,
    }
}

/// Write the manifest: a header (each line as a `# ` comment), then the passing cases sorted,
/// one name per line.
pub fn write_manifest(path: &Path, cases: &BTreeSet<String>, header: &str) -> std::io::Result<()> {
    let mut s = String::new();
    for l in header.lines() {
        let _ = writeln!(s, "# {l}");
    }
    for c in cases {
        let _ = writeln!(s, "{c}");
    }
    std::fs::write(path, s)
}

/// What the gate found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Listed in the manifest, run, and not passing (or listed but absent from the suite).
    pub regressions: Vec<String>,
    /// Passing but not listed.
    pub newly_passing: Vec<String>,
    /// The localizer changed outputs or crashed.
    pub debug_violations: Vec<String>,
}

impl Verdict {
    /// No regression, no localizer violation.
    pub fn ok(&self) -> bool {
        self.regressions.is_empty() && self.debug_violations.is_empty()
    }
}

/// Compare a run with the manifest ([`read_manifest`]); with `filter`, only the listed cases
/// whose name contains it are gated.
pub fn verdict(r: &SuiteReport, manifest: &BTreeSet<String>, filter: Option<&str>) -> Verdict {
    let by_name: HashMap<&str, &CaseResult> =
        r.results.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut v = Verdict::default();
    for m in manifest {
        if filter.is_some_and(|f| !m.contains(f)) {
            continue;
        }
        match by_name.get(m.as_str()) {
            Some(c) if c.passed() => {}
            Some(c) => v.regressions.push(format!(
                "{m}: {} {}",
                c.outcome.stage.as_str(),
                truncate(&c.outcome.detail, 200)
            )),
            None => v.regressions.push(format!(
                "{m}: not in the suite (is {} complete?)",
                r.root.display()
            )),
        }
    }
    for c in &r.results {
        if c.passed() && !manifest.contains(&c.name) {
            v.newly_passing.push(c.name.clone());
        }
        if let Some(d) = c.debug_violation() {
            v.debug_violations
                .push(format!("{}: {}", c.name, truncate(&d, 200)));
        }
    }
    v
}

/// The localizer on cases whose expected outputs hold NaN/Inf: per case, whether it ran, and
/// the culprit reports (label, op, kind) and whether a culprit names an ONNX node.
pub fn nonfinite_section(r: &SuiteReport) -> String {
    let mut s = String::new();
    let cases: Vec<&CaseResult> = r
        .results
        .iter()
        .filter(|c| c.outcome.expected_nonfinite)
        .collect();
    let mut named = 0;
    let mut ran = 0;
    for c in &cases {
        let Some(d) = &c.debug else {
            let _ = writeln!(s, "  {:55} not run ({})", c.name, c.outcome.stage.as_str());
            continue;
        };
        ran += 1;
        let culprits: Vec<String> = d
            .reports
            .iter()
            .filter(|x| x.culprit)
            .map(|x| {
                format!(
                    "{} {} \"{}\"{}",
                    x.kind,
                    x.op,
                    x.label,
                    if x.names_onnx_node {
                        ""
                    } else {
                        " (names no ONNX node or input)"
                    }
                )
            })
            .collect();
        if d.reports.iter().any(|x| x.culprit && x.names_onnx_node) {
            named += 1;
        }
        let status = if c.passed() {
            "pass"
        } else {
            c.outcome.stage.as_str()
        };
        let shown = if culprits.is_empty() {
            "NO CULPRIT REPORTED".to_string()
        } else {
            let mut v = culprits[..culprits.len().min(3)].join("; ");
            if culprits.len() > 3 {
                let _ = write!(v, "; +{} more", culprits.len() - 3);
            }
            v
        };
        let _ = writeln!(s, "  {:55} [{status}] {shown}", c.name);
    }
    format!(
        "{} cases expect NaN/Inf outputs; {ran} ran with the localizer, {named} of them got a culprit report naming an ONNX node or graph input:\n{s}",
        cases.len()
    )
}

/// Results as JSON (for tools and for comparing runs).
pub fn write_results(r: &SuiteReport, path: &Path) -> std::io::Result<()> {
    let j = serde_json::to_string_pretty(r).map_err(std::io::Error::other)?;
    std::fs::write(path, j)
}

/// The full text report: per-op table, failure classes, onnxruntime comparison, localizer
/// section (the closing line is [`SuiteReport::closing_line`]).
pub fn render(r: &SuiteReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "== ONNX node suite: {} cases under {} ({} jobs, {:.1} s)",
        r.results.len(),
        r.root.display(),
        r.jobs,
        r.wall_s
    );
    s.push_str(&op_table(r));
    let _ = writeln!(s, "\n== failure classes (most common first)");
    s.push_str(&failure_classes(r, 25));
    let (st, by_value, segments) = r.passed_by_path();
    let _ = writeln!(
        s,
        "\n== run-time values (no input is frozen): of the {} passing cases, {st} import and \
         compile as they are, {} need the runtime's dynamic path (rlx_runtime::DynamicModel): \
         {by_value} planned by the value of a parameter input (a Reshape's shape, a TopK's k), \
         {segments} ran in segments around a value-dependent node (NonZero, Unique, an If or \
         Loop deciding on a run-time value); per case: \"run_path\" in rlx_results.json",
        r.passed(),
        by_value + segments
    );
    if let Some(v) = &r.onnxruntime {
        let ort_pass = r.results.iter().filter(|c| c.ort_passed()).count();
        let rlx_only: Vec<&str> = r
            .results
            .iter()
            .filter(|c| c.passed() && !c.ort_passed())
            .map(|c| c.name.as_str())
            .collect();
        let ort_only = r
            .results
            .iter()
            .filter(|c| !c.passed() && c.ort_passed())
            .count();
        let _ = writeln!(s, "\n== onnxruntime {v}: {ort_pass} pass; RLX passes {} cases onnxruntime fails, fails {ort_only} it passes", rlx_only.len());
        if !rlx_only.is_empty() {
            let _ = writeln!(s, "  RLX right, onnxruntime not: {}", rlx_only.join(", "));
        }
        let prio: Vec<&CaseResult> = r
            .results
            .iter()
            .filter(|c| PRIORITY_OPS.contains(&c.op.as_str()) && c.ort_passed())
            .collect();
        let prio_pass = prio.iter().filter(|c| c.passed()).count();
        let _ = writeln!(s, "  priority ops (issue 3, item 4): RLX passes {prio_pass} of the {} cases onnxruntime passes", prio.len());
    }
    if r.debug_nans {
        let _ = writeln!(s, "\n== RLX_DEBUG_NANS=1 (DebugMode::Warn through the API)");
        let violations: Vec<&CaseResult> = r
            .results
            .iter()
            .filter(|c| c.debug_violation().is_some())
            .collect();
        let ran = r.results.iter().filter(|c| c.debug.is_some()).count();
        let _ = writeln!(
            s,
            "{ran} cases ran with the localizer; {} changed an output or crashed",
            violations.len()
        );
        for c in violations {
            let _ = writeln!(
                s,
                "  {}: {}",
                c.name,
                c.debug_violation().unwrap_or_default()
            );
        }
        s.push_str(&nonfinite_section(r));
    }
    s
}
