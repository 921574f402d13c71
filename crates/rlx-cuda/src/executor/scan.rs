//! The device-side NaN/Inf scan of `RLX_DEBUG_NANS`: a table of the buffers GPU nodes wrote,
//! one `nan_scan` launch after the run, counts for fused members taken inside their kernels,
//! and every node's `NonFiniteCounts` for the scanner.

use super::*;

/// The device-side scan of `RLX_DEBUG_NANS` ([`kernels::SCAN_BLOCK`]): one launch per run
/// over every f32 buffer a GPU node wrote, 48 bytes per buffer read back.
pub(super) struct ScanPlan {
    pub(super) f: CudaFunction,
    /// [address, elements, first block, blocks] per scanned buffer.
    pub(super) table: CudaSlice<u64>,
    pub(super) out: CudaSlice<u64>,
    /// `out`'s preset: zero counts, u64::MAX first indices.
    pub(super) init: Vec<u64>,
    pub(super) entries: u64,
    pub(super) blocks: u32,
    /// Scan entry of each device buffer (by buffer index).
    pub(super) entry: Vec<Option<usize>>,
    /// Count slot (after the table's entries) of each fused member but the groups' last
    /// nodes, counted inside the fused kernels; `group_slot[g]` is group g's first.
    pub(super) member_slot: Vec<Option<usize>>,
    pub(super) group_slot: Vec<usize>,
    /// First of the [`crate::attn::ROLES`] count slots of each attention group (counted by
    /// its counting kernel; the slots of roles the pattern lacks stay unread; one more slot
    /// after them counts the blocks that took the two-pass path); empty when scanning runs
    /// run the unfused steps.
    pub(super) attn_slot: Vec<usize>,
}

/// The scan table for buffers of `lens` elements at `addrs`: [address, elements, first
/// block, blocks] per non-empty buffer, and the total block count. Empty buffers get no
/// entry (`None` in the returned map).
pub(super) fn scan_table(addrs: &[u64], lens: &[u64]) -> (Vec<u64>, Vec<Option<usize>>, u64) {
    let mut tab = vec![];
    let mut entry = vec![None; lens.len()];
    let mut next = 0u64;
    for (k, (&a, &n)) in addrs.iter().zip(lens).enumerate() {
        // Bit 63 marks a bfloat16 buffer (passed on to the kernel); the rest is the count.
        let count = n & !(1u64 << 63);
        if count == 0 {
            continue;
        }
        let nb = count.div_ceil(kernels::SCAN_PER_BLOCK).min(4096);
        entry[k] = Some(tab.len() / 4);
        tab.extend_from_slice(&[a, n, next, nb]);
        next += nb;
    }
    (tab, entry, next)
}

/// Counts from a scan's six words.
pub(super) fn counts_of(len: usize, w: &[u64]) -> NonFiniteCounts {
    let first = |x: u64| (x != u64::MAX).then_some(x as usize);
    NonFiniteCounts {
        len,
        nan: w[0] as usize,
        pos_inf: w[1] as usize,
        neg_inf: w[2] as usize,
        first_nan: first(w[3]),
        first_pos_inf: first(w[4]),
        first_neg_inf: first(w[5]),
    }
}

impl CudaExecutor {
    /// Plan the device-side scan: a table entry per f32 buffer a GPU node writes, and the
    /// counts of params already set and of constants (host values that never change).
    pub(super) fn plan_scan(&mut self) -> Result<ScanPlan, CudaError> {
        let g = &self.graph;
        let f = self
            .gpu
            .module()
            .and_then(|m| {
                m.load_function("nan_scan")
                    .map_err(|e| format!("kernel nan_scan: {e}"))
            })
            .map_err(|e| CudaError::Cuda(format!("the NaN scan kernel did not load: {e}")))?;
        // Whether scanning runs use attention fusion (its members leave the elementwise
        // groups: `fz_attn`; an attention group's absorbed Transposes run their own steps).
        let attn = self.attn_scan && !self.attn.is_empty();
        let fz = if attn { &self.fz_attn } else { &self.fz };
        // Values counted inside fused groups besides their inner members (full-size float
        // inputs and the group's value, `crate::fuse::extra_counted`): each group's list, and
        // per slot the node whose counts it gives (`None`: counted but not used, the node is
        // counted elsewhere or cannot be taken from here). A value is taken from a group when
        // the group runs intact in scanning runs, a GPU step writes its buffer and no other
        // node shares that buffer (an alias keeps `nan_scan`), and no earlier group took it.
        let mut owners = vec![0usize; self.buffers.len()];
        for node in &g.nodes {
            if let Some(b) = self.buf[node.id.index()] {
                owners[b] += 1;
            }
        }
        let mut taken = vec![false; g.len()];
        let mut extra: Vec<Vec<Option<NodeId>>> = Vec::with_capacity(self.groups.len());
        for (gi, fg) in self.groups.iter().enumerate() {
            let sink = fg.members[fg.members.len() - 1];
            let intact = fz[sink.index()] == Fz::Sink(gi);
            let ext = crate::fuse::external_inputs(g, &fg.members);
            let od = g.node(sink).shape.dims_usize();
            let full: Vec<bool> = ext
                .iter()
                .map(|&e| g.node(e).shape.dims_usize() == od)
                .collect();
            let mut vals: Vec<NodeId> = crate::fuse::extra_counted(g, &ext, &full)
                .into_iter()
                .map(|e| ext[e])
                .collect();
            vals.push(sink);
            let mut list = Vec::with_capacity(vals.len());
            for v in vals {
                let k = v.index();
                let ok = intact
                    && !taken[k]
                    && !matches!(self.steps[k], Step::Leaf | Step::Cpu(_) | Step::Alias)
                    && fz[k] != Fz::Member
                    && !(attn
                        && self.afz[k] == Afz::Member
                        && !matches!(g.node(v).op, Op::Transpose { .. }))
                    && float_word(g.node(v).shape.dtype)
                    && self.buf[k].is_some_and(|b| owners[b] == 1);
                if ok {
                    taken[k] = true;
                }
                list.push(ok.then_some(v));
            }
            extra.push(list);
        }
        let mut scanned = vec![false; self.buffers.len()];
        for node in &g.nodes {
            let gpu_made = !matches!(
                self.steps[node.id.index()],
                Step::Leaf | Step::Cpu(_) | Step::Alias
            );
            // A fused member's buffer is not written in a fused run: counted in its kernel.
            let member = fz[node.id.index()] == Fz::Member
                || (attn
                    && self.afz[node.id.index()] == Afz::Member
                    && !matches!(node.op, Op::Transpose { .. }));
            // Graph inputs a GPU node reads are counted on the device after their upload
            // (counting a large input on the host would cost more than the whole scan).
            let uploaded_input =
                matches!(node.op, Op::Input { .. }) && self.upload[node.id.index()];
            if (gpu_made || uploaded_input)
                && !member
                && !taken[node.id.index()]
                && float_word(node.shape.dtype)
            {
                if let Some(b) = self.buf[node.id.index()] {
                    scanned[b] = true;
                }
            }
        }
        // Element counts of the scanned buffers (0: not scanned).
        let mut lens = vec![0u64; self.buffers.len()];
        for node in &g.nodes {
            if let Some(b) = self.buf[node.id.index()] {
                if scanned[b] && float_word(node.shape.dtype) {
                    // Bit 63: a bfloat16 buffer (16-bit values; see `nan_scan`).
                    lens[b] = node.shape.numel() as u64
                        | if half_store(node.shape.dtype) {
                            1 << 63
                        } else {
                            0
                        };
                }
            }
        }
        let (tab, entry, blocks) = scan_table(&self.ptrs, &lens);
        let entries = (tab.len() / 4) as u64;
        let blocks = u32::try_from(blocks)
            .map_err(|_| CudaError::Cuda(format!("the NaN scan needs {blocks} blocks")))?;
        let table = if tab.is_empty() {
            self.stream.alloc_zeros::<u64>(4)
        } else {
            self.stream.clone_htod(&tab[..])
        }
        .map_err(|e| cuda_err("uploading the NaN scan table", e))?;
        let mut member_slot = vec![None; g.len()];
        let mut group_slot = Vec::with_capacity(self.groups.len());
        let mut slots = entries as usize;
        for (gi, fg) in self.groups.iter().enumerate() {
            group_slot.push(slots);
            // A group split up for attention fusion runs its members' own steps.
            let intact = fz[fg.members[fg.members.len() - 1].index()] == Fz::Sink(gi);
            for &m in &fg.members[..fg.members.len() - 1] {
                if intact {
                    member_slot[m.index()] = Some(slots);
                }
                slots += 1;
            }
            // Full-size inputs, then the group's value (`extra_counted`'s order).
            for v in &extra[gi] {
                if let Some(v) = v {
                    member_slot[v.index()] = Some(slots);
                }
                slots += 1;
            }
            // The group's flag word (first word of one more slot, preset to 0): set by the
            // fused kernel when an inner value is NaN/±inf, read by its counting kernel.
            slots += 1;
        }
        let mut attn_slot = Vec::with_capacity(self.attn.len());
        for a in self.attn.iter().filter(|_| attn) {
            attn_slot.push(slots);
            for (r, m) in a.plan.roles.iter().enumerate() {
                if let Some(m) = m {
                    member_slot[m.index()] = Some(slots + r);
                }
            }
            // One more slot: its first word counts the kernel's blocks that took the
            // two-pass path (see [`crate::attn`]).
            slots += crate::attn::ROLES + 1;
        }
        let mut init = Vec::with_capacity(6 * slots);
        for _ in 0..slots {
            init.extend_from_slice(&[0, 0, 0, u64::MAX, u64::MAX, u64::MAX]);
        }
        let out = self
            .stream
            .alloc_zeros::<u64>(init.len().max(6))
            .map_err(|e| cuda_err("allocating the NaN scan counts", e))?;
        for node in &g.nodes {
            let t = match &node.op {
                Op::Param { .. } => self.params[node.id.index()].as_ref(),
                Op::Constant(t) => Some(t.as_ref()),
                _ => None,
            };
            if let Some(t) = t {
                self.leaf_counts[node.id.index()] = Some(scan_data(t.data()));
            }
        }
        Ok(ScanPlan {
            f,
            table,
            out,
            init,
            entries,
            blocks,
            entry,
            member_slot,
            group_slot,
            attn_slot,
        })
    }

    /// Preset the scan's counts (zero counts, no first index) before a scanning run's
    /// kernels: the fused kernels count their members while the run goes.
    pub(super) fn preset_scan(&self) -> Result<(), CudaError> {
        let sp = self.scan.as_ref().expect("planned before a scanning run");
        if sp.init.is_empty() {
            return Ok(());
        }
        let outp = sp.out.device_ptr(&self.stream).0;
        // SAFETY: `out` holds `init.len()` words (at least 6).
        unsafe {
            cudarc::driver::result::memcpy_htod_async(outp, &sp.init[..], self.stream.cu_stream())
        }
        .map_err(|e| cuda_err("presetting the NaN scan counts", e))
    }

    /// Launch the scan over every GPU-written f32 buffer (no host synchronization, so a CUDA
    /// graph can capture it).
    pub(super) fn launch_scan(&self) -> Result<(), CudaError> {
        let sp = self.scan.as_ref().expect("planned before a scanning run");
        if sp.init.is_empty() {
            return Ok(());
        }
        let outp = sp.out.device_ptr(&self.stream).0;
        if sp.entries > 0 {
            let tp = sp.table.device_ptr(&self.stream).0;
            let mut l = self.stream.launch_builder(&sp.f);
            l.arg(&tp).arg(&sp.entries).arg(&outp);
            let cfg = LaunchConfig {
                grid_dim: (sp.blocks, 1, 1),
                block_dim: (kernels::SCAN_BLOCK as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: signature (const u64*, u64, u64*); every table entry names a live
            // buffer of at least its element count, `out` holds 6 words per entry.
            unsafe { l.launch(cfg) }.map_err(|e| cuda_err("launching the NaN scan", e))?;
        }
        Ok(())
    }

    /// Read all counts back after [`Self::launch_scan`] (waits for the stream). Returns six
    /// words per scan entry, then per fused member slot.
    pub(super) fn read_scan(&self) -> Result<Vec<u64>, CudaError> {
        let sp = self.scan.as_ref().expect("planned before a scanning run");
        if sp.init.is_empty() {
            return Ok(vec![]);
        }
        let words = self
            .stream
            .clone_dtoh(&sp.out.slice(0..sp.init.len()))
            .map_err(|e| cuda_err("reading the NaN scan counts", e))?;
        self.stream
            .synchronize()
            .map_err(|e| cuda_err("synchronizing the NaN scan", e))?;
        Ok(words)
    }

    /// Every node's NaN/Inf counts after a scanning run: device values from the scan's
    /// words (uploaded graph inputs too), host values (inputs no GPU node reads, CPU-fallback
    /// nodes) counted here, params and constants
    /// from their cached counts, integer and Bool values clean.
    pub(super) fn node_counts(
        &self,
        host: &[Option<Cow<'_, Tensor>>],
        words: &[u64],
    ) -> Vec<NonFiniteCounts> {
        let g = &self.graph;
        let sp = self.scan.as_ref().expect("planned before a scanning run");
        let mut out: Vec<NonFiniteCounts> = Vec::with_capacity(g.len());
        for node in &g.nodes {
            let k = node.id.index();
            let len = node.shape.numel();
            let clean = NonFiniteCounts {
                len,
                ..Default::default()
            };
            if let Some(slot) = sp.member_slot[k] {
                out.push(counts_of(len, &words[6 * slot..6 * slot + 6]));
                continue;
            }
            let c = match &self.steps[k] {
                Step::Leaf => match (
                    &self.leaf_counts[k],
                    self.buf[k].and_then(|b| sp.entry[b]),
                    &host[k],
                ) {
                    (Some(c), _, _) => *c,
                    // An uploaded graph input: counted by the device scan.
                    (None, Some(e), _) if matches!(node.op, Op::Input { .. }) => {
                        counts_of(len, &words[6 * e..6 * e + 6])
                    }
                    (None, _, Some(t)) => scan_data(t.data()),
                    (None, _, None) => clean,
                },
                Step::Cpu(_) => host[k].as_ref().map_or(clean, |t| scan_data(t.data())),
                // Same values as its input.
                Step::Alias => NonFiniteCounts {
                    len,
                    ..out[node.inputs[0].index()]
                },
                _ if !float_word(node.shape.dtype) => clean,
                _ => match self.buf[k].and_then(|b| sp.entry[b]) {
                    Some(e) => counts_of(len, &words[6 * e..6 * e + 6]),
                    None => clean,
                },
            };
            out.push(c);
        }
        out
    }
}
