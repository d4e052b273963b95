//! TEMPORARY exit statistics
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
static C: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];
static OPS: std::sync::Mutex<Option<std::collections::HashMap<String, u64>>> = std::sync::Mutex::new(None);
const NAMES: [&str; 13] = ["dispatch", "jit", "jit-nobudget", "interp", "interp-insts", "uncached-nocache", "uncached-notlb", "jit-insts", "end", "resume-unsupported", "resume-miss", "miss-rest", "decode"];
pub fn add(i: usize, n: u64) { C[i].fetch_add(n, Relaxed); }
pub fn bump(i: usize) {
    let v = C[i].fetch_add(1, Relaxed);
    if i == 0 && v % (1 << 24) == 0 && v > 0 {
        let mut line = String::new();
        for (k, n) in NAMES.iter().enumerate() { line += &format!(" {}={}", n, C[k].load(Relaxed)); }
        eprintln!("XSTAT{line}");
        if let Ok(g) = OPS.lock() { if let Some(m) = g.as_ref() { let mut v: Vec<_> = m.iter().collect(); v.sort_by_key(|x| std::cmp::Reverse(*x.1)); eprintln!("XOPS {:?}", &v[..v.len().min(25)]); } }
    }
}
pub fn op(op: crate::decode::Op, insn: u32) {
    let key = if matches!(op, crate::decode::Op::Other) { format!("Other:{:02x}/{}/{:x}", insn & 0x7f, (insn >> 12) & 7, insn >> 20) } else { format!("{op:?}") };
    let mut g = OPS.lock().unwrap();
    *g.get_or_insert_with(Default::default).entry(key).or_insert(0) += 1;
}
