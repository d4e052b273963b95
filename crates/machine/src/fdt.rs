//! The device tree handed to firmware and kernel: the board as OpenSBI and
//! Linux need to see it, shaped like QEMU virt's (same node names, same
//! compatible strings, same interrupt wiring) so the drivers that work
//! there bind here. Device addresses come from `ftvm_devices::layout`,
//! the single place the memory map is written down.
//!
//! The blob is a pure function of [`FdtConfig`]: no rng-seed, no host
//! facts, so two machines built from the same config boot identically.

use ftvm_cpu::{Extensions, CBO_BLOCK_BYTES};
use ftvm_devices::layout::{
    CLINT_BASE, CLINT_SIZE, PLIC_BASE, PLIC_SIZE, RTC_BASE, RTC_IRQ, RTC_SIZE, SYSCON_BASE, SYSCON_SIZE, UART_BASE,
    UART_CLOCK_HZ, UART_IRQ, UART_SIZE, VIRTIO_STRIDE,
};
use ftvm_devices::plic::NUM_SOURCES;
use vm_fdt::{FdtWriter, FdtWriterNode};

/// What varies between machines; everything else is fixed by the board.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdtConfig {
    pub harts: usize,
    pub ram_base: u64,
    pub ram_size: u64,
    pub cmdline: String,
    /// Initrd placement as `(start, end)`, end exclusive.
    pub initrd: Option<(u64, u64)>,
    /// Ticks per second of `mtime` (10 MHz on QEMU virt).
    pub timebase_freq: u64,
    /// virtio-mmio windows as `(base, PLIC source)`. Nodes appear in this
    /// order, which is the order Linux probes them in (so the first block
    /// device listed becomes /dev/vda).
    pub virtio: Vec<(u64, u32)>,
    /// The optional extensions the harts implement, advertised to
    /// firmware and kernel.
    pub extensions: Extensions,
    /// The VM's seed (`/chosen/ftvm,seed`): its own settings for the
    /// guest's first-boot setup (lines `key=value`; see MachineConfig).
    pub seed: Option<String>,
}

/// The ISA every hart implements, in both the legacy string form (OpenSBI
/// and older kernels) and the per-extension list newer kernels prefer;
/// the optional extensions come on top (see [`isa_string`]).
const ISA_BASE: &str = "rv64i";
const ISA_EXTENSIONS: &[&str] = &["i", "m", "a", "f", "d", "c", "zicntr", "zicsr", "zifencei"];

/// The `riscv,isa` string: the multi-letter extensions in canonical
/// order (Z extensions by the single-letter category they belong to, I
/// then B, alphabetically within it; then S extensions), which stricter
/// parsers require.
fn isa_string(ext: Extensions) -> String {
    let optional = |e: Extensions, name: &'static str| ext.has(e).then_some(name);
    let parts = [
        Some("rv64imafdc"),
        optional(Extensions::ZICBOM, "zicbom"),
        optional(Extensions::ZICBOZ, "zicboz"),
        Some("zicntr"),
        optional(Extensions::ZICOND, "zicond"),
        Some("zicsr"),
        Some("zifencei"),
        optional(Extensions::ZBA, "zba"),
        optional(Extensions::ZBB, "zbb"),
        optional(Extensions::ZBS, "zbs"),
        optional(Extensions::SSTC, "sstc"),
    ];
    parts.into_iter().flatten().collect::<Vec<_>>().join("_")
}
const MMU_TYPE: &str = "riscv,sv48";

/// Local interrupt numbers as the CPU's interrupt controller sees them.
const IRQ_M_SOFT: u32 = 3;
const IRQ_M_TIMER: u32 = 7;
const IRQ_S_EXT: u32 = 9;
const IRQ_M_EXT: u32 = 11;

const PHANDLE_PLIC: u32 = 1;
const PHANDLE_TEST: u32 = 2;
fn phandle_cpu(hart: usize) -> u32 {
    3 + 2 * hart as u32
}
fn phandle_intc(hart: usize) -> u32 {
    4 + 2 * hart as u32
}

/// Most harts the tree describes; far beyond what the machine runs, it
/// only keeps phandle arithmetic in range.
const MAX_HARTS: usize = 1024;

const SYSCON_POWEROFF: u32 = 0x5555;
const SYSCON_REBOOT: u32 = 0x7777;

/// Why a device tree cannot be built for a configuration.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FdtError {
    #[error("cannot describe {0} harts")]
    Harts(usize),
    #[error("no RAM")]
    NoRam,
    #[error("timebase frequency {0} does not fit a cell")]
    TimebaseFrequency(u64),
    #[error("initrd ends ({end:#x}) before it starts ({start:#x})")]
    InitrdRange { start: u64, end: u64 },
    /// The writer refused the tree.
    #[error(transparent)]
    Writer(#[from] vm_fdt::Error),
}

pub fn build_fdt(cfg: &FdtConfig) -> Result<Vec<u8>, FdtError> {
    if cfg.harts == 0 || cfg.harts > MAX_HARTS {
        return Err(FdtError::Harts(cfg.harts));
    }
    if cfg.ram_size == 0 {
        return Err(FdtError::NoRam);
    }
    if cfg.timebase_freq == 0 || cfg.timebase_freq > u32::MAX as u64 {
        return Err(FdtError::TimebaseFrequency(cfg.timebase_freq));
    }
    if let Some((start, end)) = cfg.initrd {
        if end < start {
            return Err(FdtError::InitrdRange { start, end });
        }
    }
    Ok(build(cfg)?)
}

fn build(cfg: &FdtConfig) -> Result<Vec<u8>, vm_fdt::Error> {
    let mut w = FdtWriter::new()?;
    let root = w.begin_node("")?;
    w.property_u32("#address-cells", 2)?;
    w.property_u32("#size-cells", 2)?;
    w.property_string("compatible", "riscv-virtio")?;
    w.property_string("model", "riscv-virtio,ftvm")?;

    chosen(&mut w, cfg)?;

    let mem = w.begin_node(&format!("memory@{:x}", cfg.ram_base))?;
    w.property_string("device_type", "memory")?;
    w.property_array_u64("reg", &[cfg.ram_base, cfg.ram_size])?;
    w.end_node(mem)?;

    cpus(&mut w, cfg)?;
    soc(&mut w, cfg)?;

    // The syscon-poweroff/reboot drivers are bound from root-level nodes,
    // as on QEMU virt.
    for (name, value) in [("poweroff", SYSCON_POWEROFF), ("reboot", SYSCON_REBOOT)] {
        let n = w.begin_node(name)?;
        w.property_string("compatible", &format!("syscon-{name}"))?;
        w.property_u32("regmap", PHANDLE_TEST)?;
        w.property_u32("offset", 0)?;
        w.property_u32("value", value)?;
        w.end_node(n)?;
    }

    w.end_node(root)?;
    w.finish()
}

fn chosen(w: &mut FdtWriter, cfg: &FdtConfig) -> Result<(), vm_fdt::Error> {
    let n = w.begin_node("chosen")?;
    w.property_string("bootargs", &cfg.cmdline)?;
    w.property_string("stdout-path", &format!("/soc/serial@{UART_BASE:x}"))?;
    if let Some((start, end)) = cfg.initrd {
        w.property_u64("linux,initrd-start", start)?;
        w.property_u64("linux,initrd-end", end)?;
    }
    if let Some(seed) = &cfg.seed {
        w.property_string("ftvm,seed", seed)?;
    }
    w.end_node(n)
}

fn cpus(w: &mut FdtWriter, cfg: &FdtConfig) -> Result<(), vm_fdt::Error> {
    let cpus = w.begin_node("cpus")?;
    w.property_u32("#address-cells", 1)?;
    w.property_u32("#size-cells", 0)?;
    w.property_u32("timebase-frequency", cfg.timebase_freq as u32)?;
    let extensions: Vec<String> =
        ISA_EXTENSIONS.iter().copied().chain(cfg.extensions.names()).map(|s| s.to_string()).collect();
    let isa = isa_string(cfg.extensions);
    for hart in 0..cfg.harts {
        let cpu = w.begin_node(&format!("cpu@{hart:x}"))?;
        w.property_string("device_type", "cpu")?;
        w.property_u32("reg", hart as u32)?;
        w.property_string("status", "okay")?;
        w.property_string("compatible", "riscv")?;
        w.property_string("riscv,isa", &isa)?;
        w.property_string("riscv,isa-base", ISA_BASE)?;
        w.property_string_list("riscv,isa-extensions", extensions.clone())?;
        w.property_string("mmu-type", MMU_TYPE)?;
        // Without its block size, Linux turns either extension off (and
        // OpenSBI would still enable it): the two go together.
        if cfg.extensions.has(Extensions::ZICBOM) {
            w.property_u32("riscv,cbom-block-size", CBO_BLOCK_BYTES as u32)?;
        }
        if cfg.extensions.has(Extensions::ZICBOZ) {
            w.property_u32("riscv,cboz-block-size", CBO_BLOCK_BYTES as u32)?;
        }
        w.property_phandle(phandle_cpu(hart))?;
        let intc = w.begin_node("interrupt-controller")?;
        // No child addresses; dtc warns about interrupt providers without it.
        w.property_u32("#address-cells", 0)?;
        w.property_u32("#interrupt-cells", 1)?;
        w.property_null("interrupt-controller")?;
        w.property_string("compatible", "riscv,cpu-intc")?;
        w.property_phandle(phandle_intc(hart))?;
        w.end_node(intc)?;
        w.end_node(cpu)?;
    }
    let map = w.begin_node("cpu-map")?;
    let cluster = w.begin_node("cluster0")?;
    for hart in 0..cfg.harts {
        let core = w.begin_node(&format!("core{hart}"))?;
        w.property_u32("cpu", phandle_cpu(hart))?;
        w.end_node(core)?;
    }
    w.end_node(cluster)?;
    w.end_node(map)?;
    w.end_node(cpus)
}

/// `interrupts-extended` cells wiring each hart's local interrupt `irqs`.
fn per_hart_irqs(harts: usize, irqs: &[u32]) -> Vec<u32> {
    let mut cells = Vec::with_capacity(harts * irqs.len() * 2);
    for hart in 0..harts {
        for &irq in irqs {
            cells.push(phandle_intc(hart));
            cells.push(irq);
        }
    }
    cells
}

fn device(w: &mut FdtWriter, name: &str, base: u64, size: u64) -> Result<FdtWriterNode, vm_fdt::Error> {
    let n = w.begin_node(&format!("{name}@{base:x}"))?;
    w.property_array_u64("reg", &[base, size])?;
    Ok(n)
}

fn soc(w: &mut FdtWriter, cfg: &FdtConfig) -> Result<(), vm_fdt::Error> {
    let soc = w.begin_node("soc")?;
    w.property_u32("#address-cells", 2)?;
    w.property_u32("#size-cells", 2)?;
    w.property_string("compatible", "simple-bus")?;
    w.property_null("ranges")?;

    let n = device(w, "clint", CLINT_BASE, CLINT_SIZE)?;
    w.property_string_list("compatible", vec!["sifive,clint0".into(), "riscv,clint0".into()])?;
    w.property_array_u32("interrupts-extended", &per_hart_irqs(cfg.harts, &[IRQ_M_SOFT, IRQ_M_TIMER]))?;
    w.end_node(n)?;

    // Context 2h is hart h's M-mode, 2h+1 its S-mode: the order of these
    // cells is what defines that numbering for the drivers.
    let n = device(w, "plic", PLIC_BASE, PLIC_SIZE)?;
    w.property_string_list("compatible", vec!["sifive,plic-1.0.0".into(), "riscv,plic0".into()])?;
    w.property_u32("#address-cells", 0)?;
    w.property_u32("#interrupt-cells", 1)?;
    w.property_null("interrupt-controller")?;
    w.property_u32("riscv,ndev", NUM_SOURCES)?;
    w.property_array_u32("interrupts-extended", &per_hart_irqs(cfg.harts, &[IRQ_M_EXT, IRQ_S_EXT]))?;
    w.property_phandle(PHANDLE_PLIC)?;
    w.end_node(n)?;

    let n = device(w, "serial", UART_BASE, UART_SIZE)?;
    w.property_string("compatible", "ns16550a")?;
    w.property_u32("clock-frequency", UART_CLOCK_HZ)?;
    w.property_u32("interrupt-parent", PHANDLE_PLIC)?;
    w.property_u32("interrupts", UART_IRQ)?;
    w.end_node(n)?;

    let n = device(w, "test", SYSCON_BASE, SYSCON_SIZE)?;
    w.property_string_list("compatible", vec!["sifive,test1".into(), "sifive,test0".into(), "syscon".into()])?;
    w.property_phandle(PHANDLE_TEST)?;
    w.end_node(n)?;

    // Linux's rtc-goldfish binds here and sets the guest's date from it at
    // boot (CONFIG_RTC_HCTOSYS).
    let n = device(w, "rtc", RTC_BASE, RTC_SIZE)?;
    w.property_string("compatible", "google,goldfish-rtc")?;
    w.property_u32("interrupt-parent", PHANDLE_PLIC)?;
    w.property_u32("interrupts", RTC_IRQ)?;
    w.end_node(n)?;

    for &(base, irq) in &cfg.virtio {
        let n = device(w, "virtio_mmio", base, VIRTIO_STRIDE)?;
        w.property_string("compatible", "virtio,mmio")?;
        w.property_u32("interrupt-parent", PHANDLE_PLIC)?;
        w.property_u32("interrupts", irq)?;
        w.end_node(n)?;
    }

    w.end_node(soc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Node path -> property name -> raw value, read back from a blob by a
    /// minimal flattened-tree reader (enough to check what we wrote).
    type Tree = BTreeMap<String, BTreeMap<String, Vec<u8>>>;

    fn be32(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn cstr(b: &[u8], at: usize) -> String {
        let end = b[at..].iter().position(|&c| c == 0).unwrap() + at;
        String::from_utf8(b[at..end].to_vec()).unwrap()
    }

    fn parse(blob: &[u8]) -> Tree {
        assert_eq!(be32(blob, 0), 0xd00d_feed, "magic");
        assert_eq!(be32(blob, 4) as usize, blob.len(), "totalsize");
        let structs = be32(blob, 8) as usize;
        let strings = be32(blob, 12) as usize;
        assert_eq!(be32(blob, 20), 17, "version");
        let mut tree = Tree::new();
        let mut path: Vec<String> = Vec::new();
        let mut at = structs;
        let align = |x: usize| (x + 3) & !3;
        loop {
            let tok = be32(blob, at);
            at += 4;
            match tok {
                1 => {
                    let name = cstr(blob, at);
                    at = align(at + name.len() + 1);
                    path.push(name);
                    let p = if path.len() == 1 {
                        "/".to_string()
                    } else {
                        path[1..].iter().map(|s| format!("/{s}")).collect()
                    };
                    assert!(tree.insert(p, BTreeMap::new()).is_none(), "duplicate node");
                }
                2 => {
                    path.pop();
                }
                3 => {
                    let len = be32(blob, at) as usize;
                    let name = cstr(blob, strings + be32(blob, at + 4) as usize);
                    let val = blob[at + 8..at + 8 + len].to_vec();
                    at = align(at + 8 + len);
                    let p = if path.len() == 1 {
                        "/".to_string()
                    } else {
                        path[1..].iter().map(|s| format!("/{s}")).collect()
                    };
                    tree.get_mut(&p).unwrap().insert(name, val);
                }
                4 => {}
                9 => break,
                t => panic!("bad token {t}"),
            }
        }
        assert!(path.is_empty());
        tree
    }

    fn prop<'a>(t: &'a Tree, node: &str, name: &str) -> &'a [u8] {
        t.get(node).unwrap_or_else(|| panic!("no node {node}")).get(name).unwrap_or_else(|| panic!("no {node}:{name}"))
    }

    fn cells(v: &[u8]) -> Vec<u32> {
        v.chunks(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect()
    }

    fn strs(v: &[u8]) -> Vec<String> {
        v.split(|&c| c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8(s.to_vec()).unwrap()).collect()
    }

    fn config() -> FdtConfig {
        FdtConfig {
            harts: 2,
            ram_base: 0x8000_0000,
            ram_size: 512 << 20,
            cmdline: "console=ttyS0 root=/dev/vda rw".into(),
            initrd: Some((0x9000_0000, 0x9100_0000)),
            timebase_freq: 10_000_000,
            virtio: (0..8).map(|i| (0x1000_1000 + 0x1000 * i as u64, 1 + i)).collect(),
            extensions: Extensions::ALL,
            seed: None,
        }
    }

    /// A machine of the old extension set (replaying an older build's
    /// log) describes the harts exactly as that build did.
    #[test]
    fn no_optional_extensions_is_the_old_isa() {
        let blob = build_fdt(&FdtConfig { extensions: Extensions::NONE, ..config() }).unwrap();
        let t = parse(&blob);
        assert_eq!(strs(prop(&t, "/cpus/cpu@0", "riscv,isa")), ["rv64imafdc_zicntr_zicsr_zifencei"]);
        assert_eq!(strs(prop(&t, "/cpus/cpu@0", "riscv,isa-extensions")), ISA_EXTENSIONS);
        assert_eq!(isa_string(Extensions::ZBB), "rv64imafdc_zicntr_zicsr_zifencei_zbb");
        assert!(!t["/cpus/cpu@0"].contains_key("riscv,cbom-block-size"));
        assert!(!t["/cpus/cpu@0"].contains_key("riscv,cboz-block-size"));
        // The build before the cache-block operations: no block sizes.
        let sstc_era = Extensions::parse("zicond_zba_zbb_zbs_sstc").unwrap();
        let t = parse(&build_fdt(&FdtConfig { extensions: sstc_era, ..config() }).unwrap());
        assert_eq!(
            strs(prop(&t, "/cpus/cpu@0", "riscv,isa")),
            ["rv64imafdc_zicntr_zicond_zicsr_zifencei_zba_zbb_zbs_sstc"]
        );
        assert!(!t["/cpus/cpu@0"].contains_key("riscv,cbom-block-size"));
        assert!(!t["/cpus/cpu@0"].contains_key("riscv,cboz-block-size"));
    }

    /// The seed is a string property of /chosen, as the guest's setup
    /// reads it from /sys/firmware/devicetree/base/chosen/ftvm,seed.
    #[test]
    fn the_seed_is_in_chosen() {
        let seed = "hostname=db1\nssh-key=ssh-ed25519 AAAA root@host\n";
        let t = parse(&build_fdt(&FdtConfig { seed: Some(seed.into()), ..config() }).unwrap());
        assert_eq!(prop(&t, "/chosen", "ftvm,seed"), format!("{seed}\0").as_bytes());
    }

    #[test]
    fn tree_has_what_opensbi_and_linux_need() {
        let blob = build_fdt(&config()).unwrap();
        let t = parse(&blob);

        assert_eq!(strs(prop(&t, "/chosen", "bootargs")), ["console=ttyS0 root=/dev/vda rw"]);
        assert_eq!(strs(prop(&t, "/chosen", "stdout-path")), ["/soc/serial@10000000"]);
        assert_eq!(prop(&t, "/chosen", "linux,initrd-start"), 0x9000_0000u64.to_be_bytes());
        assert_eq!(prop(&t, "/chosen", "linux,initrd-end"), 0x9100_0000u64.to_be_bytes());
        assert!(!t["/chosen"].contains_key("rng-seed"));
        assert!(!t["/chosen"].contains_key("ftvm,seed"));

        assert_eq!(cells(prop(&t, "/memory@80000000", "reg")), [0, 0x8000_0000, 0, 0x2000_0000]);
        assert_eq!(cells(prop(&t, "/cpus", "timebase-frequency")), [10_000_000]);

        let mut intc = Vec::new();
        for h in 0..2 {
            let cpu = format!("/cpus/cpu@{h}");
            assert_eq!(cells(prop(&t, &cpu, "reg")), [h]);
            assert_eq!(
                strs(prop(&t, &cpu, "riscv,isa")),
                ["rv64imafdc_zicbom_zicboz_zicntr_zicond_zicsr_zifencei_zba_zbb_zbs_sstc"]
            );
            assert_eq!(strs(prop(&t, &cpu, "riscv,isa-base")), ["rv64i"]);
            assert_eq!(
                strs(prop(&t, &cpu, "riscv,isa-extensions")),
                [
                    "i", "m", "a", "f", "d", "c", "zicntr", "zicsr", "zifencei", "zicbom", "zicboz", "zicond", "zba",
                    "zbb", "zbs", "sstc"
                ]
            );
            assert_eq!(cells(prop(&t, &cpu, "riscv,cbom-block-size")), [64]);
            assert_eq!(cells(prop(&t, &cpu, "riscv,cboz-block-size")), [64]);
            assert_eq!(strs(prop(&t, &cpu, "mmu-type")), ["riscv,sv48"]);
            let ic = format!("{cpu}/interrupt-controller");
            assert_eq!(strs(prop(&t, &ic, "compatible")), ["riscv,cpu-intc"]);
            assert!(prop(&t, &ic, "interrupt-controller").is_empty());
            intc.push(cells(prop(&t, &ic, "phandle"))[0]);
            let core = format!("/cpus/cpu-map/cluster0/core{h}");
            assert_eq!(cells(prop(&t, &core, "cpu")), cells(prop(&t, &cpu, "phandle")));
        }
        assert_ne!(intc[0], intc[1]);

        let clint = "/soc/clint@2000000";
        assert_eq!(strs(prop(&t, clint, "compatible")), ["sifive,clint0", "riscv,clint0"]);
        assert_eq!(cells(prop(&t, clint, "reg")), [0, 0x200_0000, 0, 0x1_0000]);
        assert_eq!(cells(prop(&t, clint, "interrupts-extended")), [intc[0], 3, intc[0], 7, intc[1], 3, intc[1], 7]);

        let plic = "/soc/plic@c000000";
        assert_eq!(strs(prop(&t, plic, "compatible")), ["sifive,plic-1.0.0", "riscv,plic0"]);
        assert_eq!(cells(prop(&t, plic, "reg")), [0, 0xc00_0000, 0, 0x60_0000]);
        assert_eq!(cells(prop(&t, plic, "riscv,ndev")), [NUM_SOURCES]);
        assert_eq!(cells(prop(&t, plic, "interrupts-extended")), [intc[0], 11, intc[0], 9, intc[1], 11, intc[1], 9]);
        let plic_ph = cells(prop(&t, plic, "phandle"))[0];

        let uart = "/soc/serial@10000000";
        assert_eq!(strs(prop(&t, uart, "compatible")), ["ns16550a"]);
        assert_eq!(cells(prop(&t, uart, "clock-frequency")), [3_686_400]);
        assert_eq!(cells(prop(&t, uart, "interrupts")), [10]);
        assert_eq!(cells(prop(&t, uart, "interrupt-parent")), [plic_ph]);

        let test = "/soc/test@100000";
        assert_eq!(strs(prop(&t, test, "compatible")), ["sifive,test1", "sifive,test0", "syscon"]);
        let test_ph = cells(prop(&t, test, "phandle"))[0];
        for (node, value) in [("/poweroff", 0x5555), ("/reboot", 0x7777)] {
            assert_eq!(cells(prop(&t, node, "regmap")), [test_ph]);
            assert_eq!(cells(prop(&t, node, "offset")), [0]);
            assert_eq!(cells(prop(&t, node, "value")), [value]);
        }
        assert_eq!(strs(prop(&t, "/poweroff", "compatible")), ["syscon-poweroff"]);
        assert_eq!(strs(prop(&t, "/reboot", "compatible")), ["syscon-reboot"]);

        let rtc = "/soc/rtc@101000";
        assert_eq!(strs(prop(&t, rtc, "compatible")), ["google,goldfish-rtc"]);
        assert_eq!(cells(prop(&t, rtc, "reg")), [0, 0x10_1000, 0, 0x1000]);
        assert_eq!(cells(prop(&t, rtc, "interrupts")), [11]);
        assert_eq!(cells(prop(&t, rtc, "interrupt-parent")), [plic_ph]);

        for i in 0..8u32 {
            let node = format!("/soc/virtio_mmio@{:x}", 0x1000_1000 + 0x1000 * i);
            assert_eq!(strs(prop(&t, &node, "compatible")), ["virtio,mmio"]);
            assert_eq!(cells(prop(&t, &node, "reg")), [0, 0x1000_1000 + 0x1000 * i, 0, 0x1000]);
            assert_eq!(cells(prop(&t, &node, "interrupts")), [1 + i]);
            assert_eq!(cells(prop(&t, &node, "interrupt-parent")), [plic_ph]);
        }
    }

    #[test]
    fn deterministic_and_optional_parts() {
        let a = build_fdt(&config()).unwrap();
        assert_eq!(a, build_fdt(&config()).unwrap());
        let mut c = config();
        c.initrd = None;
        c.harts = 1;
        c.virtio.clear();
        let t = parse(&build_fdt(&c).unwrap());
        assert!(!t["/chosen"].contains_key("linux,initrd-start"));
        assert!(!t.contains_key("/cpus/cpu@1"));
        assert!(!t.keys().any(|k| k.contains("virtio")));
    }

    #[test]
    fn bad_configs_are_errors() {
        let mut c = config();
        c.harts = 0;
        assert!(build_fdt(&c).is_err());
        let mut c = config();
        c.cmdline = "a\0b".into();
        assert!(build_fdt(&c).is_err());
        let mut c = config();
        c.initrd = Some((2, 1));
        assert!(build_fdt(&c).is_err());
        let mut c = config();
        c.timebase_freq = 1 << 40;
        assert!(build_fdt(&c).is_err());
    }

    /// When the device-tree compiler is installed, it must accept the blob
    /// without complaint.
    #[test]
    fn dtc_accepts_it() {
        let dir = std::env::temp_dir().join(format!("ftvm-fdt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dtb = dir.join("board.dtb");
        std::fs::write(&dtb, build_fdt(&config()).unwrap()).unwrap();
        let out = std::process::Command::new("dtc").args(["-I", "dtb", "-O", "dts"]).arg(&dtb).output();
        std::fs::remove_dir_all(&dir).ok();
        let Ok(out) = out else { return };
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stderr.is_empty(), "dtc warnings: {}", String::from_utf8_lossy(&out.stderr));
    }
}
