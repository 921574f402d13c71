//! ONNX `Loop`s that run at run time ([`run_loop`]): the body, a model of its own, once per
//! iteration (split from dynamic.rs, which plans and runs the segments around it).

use super::*;

/// Where a Loop runs at run time: the model's device and compile options, its name in
/// messages, and the enclosing model's report context (a loop nested in another's body).
pub(super) struct LoopEnv {
    pub(super) device: Device,
    pub(super) options: CompileOptions,
    pub(super) name: String,
    pub(super) outer: Option<String>,
}

/// Most iterations a Loop run at run time may take (a trip count of 10^12 must not run, or
/// stack scan outputs, until memory runs out).
const MAX_LOOP_ITERATIONS: usize = 1 << 20;

/// Run the cut Loop at run time: its body (a model of its own, [`Cut::loop_body`]) once per
/// iteration, fed the iteration number, the condition, the carried values and the outer
/// values it reads, until the trip count is reached or the condition turns false (ONNX
/// `Loop`, opset 13-21). Returns the Loop's outputs by name: the final carried values, then
/// each scan output stacked along a new axis 0. NaN reports of the body name its nodes and
/// the iteration.
///
/// [`Cut::loop_body`]: rlx_onnx_import::cut::Cut::loop_body
pub(super) fn run_loop(
    cut: &rlx_onnx_import::cut::Cut,
    body: &mut Option<DynamicModel>,
    vals: &HashMap<String, Tensor>,
    env: &LoopEnv,
    reported: &mut bool,
) -> Result<Vec<(String, Tensor)>, RuntimeError> {
    let LoopEnv {
        device,
        options,
        name,
        outer,
    } = env;
    let (device, outer) = (*device, outer.as_deref());
    let at = cut.node_label();
    let err = |m: String| RuntimeError::Input(format!("{name}: Loop {at} at run time: {m}"));
    let ins = cut.op_node_inputs();
    // The node's inputs: values of this run, else the model's initializers.
    let inits: HashMap<String, Tensor> = ins
        .iter()
        .filter(|n| !n.is_empty() && !vals.contains_key(*n))
        .filter_map(|n| cut.initializer(n).map(|t| (n.clone(), t)))
        .collect();
    let get = |k: usize| -> Result<Option<&Tensor>, RuntimeError> {
        match ins.get(k).filter(|s| !s.is_empty()) {
            None => Ok(None),
            Some(n) => vals
                .get(n)
                .or_else(|| inits.get(n))
                .map(Some)
                .ok_or_else(|| err(format!("input \"{n}\" was not computed"))),
        }
    };
    let scalar = |t: &Tensor, what: &str| -> Result<f64, RuntimeError> {
        if t.numel() != 1 {
            return Err(err(format!(
                "{what} must hold one value, got {}",
                t.shape()
            )));
        }
        Ok(t.data().to_f64_vec()[0])
    };
    let trip = match get(0)? {
        Some(t) => Some(scalar(t, "the trip count M")?.max(0.0) as u64),
        None => None,
    };
    let use_cond = get(1)?.is_some();
    let mut cond = match get(1)? {
        Some(t) => scalar(t, "the condition")? != 0.0,
        None => true,
    };
    if trip.is_none() && !use_cond {
        return Err(err(
            "neither a trip count nor a condition: it would never stop".into(),
        ));
    }
    let mut carried: Vec<Tensor> = vec![];
    for k in 2..ins.len() {
        carried.push(
            get(k)?
                .cloned()
                .ok_or_else(|| err(format!("loop-carried input {k} is empty")))?,
        );
    }
    let outs = cut.op_node_outputs();
    let n_carried = carried.len();
    let mut scans: Vec<Vec<Tensor>> = vec![];
    let mut i: u64 = 0;
    while trip.is_none_or(|m| i < m) && (!use_cond || cond) {
        if i as usize >= MAX_LOOP_ITERATIONS {
            return Err(err(format!(
                "{MAX_LOOP_ITERATIONS} iterations and it has not stopped (trip count {}); RLX runs at most that many at run time",
                trip.map_or("none".to_string(), |m| m.to_string())
            )));
        }
        let iter_t = Tensor::scalar(rlx_ir::DType::I64, i as f64);
        let cond_t = Tensor::scalar(rlx_ir::DType::Bool, if cond { 1.0 } else { 0.0 });
        if body.is_none() {
            let mut types: HashMap<String, (rlx_ir::DType, usize)> = vals
                .iter()
                .map(|(n, t)| (n.clone(), (t.dtype(), t.dims().len())))
                .collect();
            let formal = cut.loop_body_inputs();
            let firsts = [&iter_t, &cond_t].into_iter().chain(carried.iter());
            for (n, t) in formal.iter().zip(firsts) {
                types.insert(n.clone(), (t.dtype(), t.dims().len()));
            }
            let (m, _) = cut.loop_body(&types).map_err(err)?;
            let bname = format!("{name} (body of Loop {at})");
            let ranges: BTreeMap<String, DimRange> = m
                .declared_inputs()
                .iter()
                .flat_map(|(_, s)| s.dims.iter())
                .filter_map(|d| match d {
                    Dim::Sym(s) => Some((s.clone(), DimRange { min: 0, max: None })),
                    Dim::Static(_) => None,
                })
                .collect();
            let b = DynamicModel::new(Arc::new(OnnxSource::from_model(m, &bname)), device, ranges)?
                .with_options(options.clone());
            *body = Some(b);
        }
        let b = body.as_mut().expect("made above");
        // Nested in another loop's body: its iteration follows (outermost last here, as the
        // enclosing model's context already names it).
        let within = outer.map(|o| format!("; in {o}")).unwrap_or_default();
        b.set_context(Some(format!(
            "iteration {i} of Loop \"{}\", its body run at run time{within}",
            cut.node_name()
        )));
        let formal = cut.loop_body_inputs();
        let mut feed: Vec<(&str, &Tensor)> = vec![];
        let firsts: Vec<&Tensor> = [&iter_t, &cond_t]
            .into_iter()
            .chain(carried.iter())
            .collect();
        for (n, t) in formal.iter().zip(firsts) {
            feed.push((n.as_str(), t));
        }
        let fed_names = b.plan_inputs_declared();
        for n in &fed_names {
            if !feed.iter().any(|(f, _)| f == n) {
                if let Some(t) = vals.get(n) {
                    feed.push((n.as_str(), t));
                }
            }
        }
        b.set_quiet_input_reports(*reported);
        let mut res = b.run_tensors(&feed)?.into_iter();
        *reported |= b.last_run_reported();
        let c = res
            .next()
            .ok_or_else(|| err("the body gave no condition".into()))?;
        cond = scalar(&c, "the body's condition")? != 0.0;
        carried = res.by_ref().take(n_carried).collect();
        if carried.len() != n_carried {
            return Err(err(
                "the body gave fewer carried values than the Loop has".into()
            ));
        }
        for (k, t) in res.enumerate() {
            if scans.len() <= k {
                scans.push(vec![]);
            }
            scans[k].push(t);
        }
        i += 1;
    }
    let mut out: Vec<(String, Tensor)> = vec![];
    for (n, t) in outs.iter().zip(carried) {
        if !n.is_empty() {
            out.push((n.clone(), t));
        }
    }
    for (k, n) in outs.iter().enumerate().skip(n_carried) {
        if n.is_empty() {
            continue;
        }
        match scans.get(k - n_carried).filter(|p| !p.is_empty()) {
            Some(parts) => out.push((n.clone(), stack(parts).map_err(err)?)),
            // No iteration ran: an empty stack of the body's declared element type.
            None => {
                let declared = cut.loop_body_output_types().get(1 + k).cloned().flatten();
                let (dt, dims) = declared.ok_or_else(|| {
                    err(format!(
                        "scan output \"{n}\" after 0 iterations: the body does not declare its element shape"
                    ))
                })?;
                out.push((
                    n.clone(),
                    rlx_onnx_import::empty_scan_output(dt, &dims).map_err(err)?,
                ));
            }
        }
    }
    Ok(out)
}

/// Stack equal-shaped tensors along a new axis 0 (a Loop's scan output).
fn stack(parts: &[Tensor]) -> Result<Tensor, String> {
    let first = &parts[0];
    let mut dims = vec![1];
    dims.extend_from_slice(first.dims());
    let ups: Vec<Tensor> = parts
        .iter()
        .map(|t| {
            if t.dims() != first.dims() || t.dtype() != first.dtype() {
                return Err(format!(
                    "scan output values differ between iterations: {} and {}",
                    first.shape(),
                    t.shape()
                ));
            }
            t.clone().reshaped(dims.clone()).map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let refs: Vec<&Tensor> = ups.iter().collect();
    let mut out_dims = dims.clone();
    out_dims[0] = parts.len();
    let shape = rlx_ir::Shape::new(&out_dims, first.dtype());
    rlx_cpu::eval_op(&rlx_ir::Op::Concat { axis: 0 }, &refs, &shape).map_err(|e| e.to_string())
}
