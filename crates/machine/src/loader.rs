//! Putting firmware, kernel, initrd and device tree into guest RAM, and the
//! register values harts start with.
//!
//! Layout (as QEMU virt does it): firmware at the start of RAM; the kernel
//! at the offset its Image header asks for (2 MiB by default); the device
//! tree in the top 2 MiB of RAM with OpenSBI's `fw_dynamic_info` beside it;
//! the initrd right below the device tree. Bare-metal ELF programs (no
//! firmware) are loaded by their program headers.
//!
//! We parse ELF ourselves: we need only PT_LOAD segments of a 64-bit
//! little-endian RISC-V file, and linux-loader's ELF support is built
//! around x86 and vm-memory's traits.

use crate::layout::{KERNEL_OFFSET, RAM_BASE};
use crate::machine::MachineError;
use ftvm_memory::GuestRam;

const MIB: u64 = 1 << 20;
/// Space reserved at the top of RAM for the device tree and boot info.
const FDT_REGION: u64 = 2 * MIB;
pub const FDT_MAX_SIZE: u64 = MIB;
/// OpenSBI's fw_dynamic_info magic ("OSBI") and the version we fill in.
const FW_DYNAMIC_MAGIC: u64 = 0x4942_534f;
const FW_DYNAMIC_VERSION: u64 = 2;
const NEXT_MODE_S: u64 = 1;

fn err<T>(msg: impl Into<String>) -> Result<T, MachineError> {
    Err(MachineError(msg.into()))
}

/// Where things landed; what the harts and the device tree need to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootPlan {
    /// Where every hart starts (firmware, or the bare-metal program).
    pub entry: u64,
    pub fdt_addr: u64,
    pub initrd: Option<(u64, u64)>,
    /// Address of OpenSBI's fw_dynamic_info, passed in a2.
    pub fw_dynamic_info: Option<u64>,
}

/// The fixed part of the layout, decided before the device tree is built
/// (the tree must name the initrd's place).
pub fn plan(
    ram: &GuestRam,
    firmware: Option<&[u8]>,
    kernel: &[u8],
    initrd: Option<&[u8]>,
) -> Result<(BootPlan, u64), MachineError> {
    if ram.size() < 2 * FDT_REGION {
        return err(format!("{} MiB of RAM is too small to boot anything", ram.size() / MIB));
    }
    let fdt_addr = ram.end() - FDT_REGION;
    let kernel_span = kernel_span(firmware.is_some(), kernel)?;
    let mut lowest_free = kernel_span.1;
    if let Some(fw) = firmware {
        let fw_end = RAM_BASE + fw.len() as u64;
        if fw_end > kernel_span.0 {
            return err(format!("firmware of {} bytes overlaps the kernel at {:#x}", fw.len(), kernel_span.0));
        }
        lowest_free = lowest_free.max(fw_end);
    }
    let initrd_range = match initrd {
        Some(data) => {
            let start = (fdt_addr - data.len() as u64) & !0xfff;
            if data.len() as u64 > fdt_addr || start < lowest_free {
                return err(format!(
                    "{} MiB of RAM is too small for this kernel and initrd (need at least {} MiB)",
                    ram.size() / MIB,
                    (kernel_span.1 - RAM_BASE + data.len() as u64 + FDT_REGION).div_ceil(MIB) + 1
                ));
            }
            Some((start, start + data.len() as u64))
        }
        None => None,
    };
    if lowest_free > fdt_addr {
        return err(format!("{} MiB of RAM is too small for this kernel", ram.size() / MIB));
    }
    let entry = if firmware.is_some() { RAM_BASE } else { kernel_span.2 };
    let info = firmware.map(|_| fdt_addr + FDT_MAX_SIZE);
    Ok((BootPlan { entry, fdt_addr, initrd: initrd_range, fw_dynamic_info: info }, kernel_span.0))
}

/// Write everything into RAM according to `plan`.
pub fn load(
    ram: &mut GuestRam,
    plan: &BootPlan,
    firmware: Option<&[u8]>,
    kernel: &[u8],
    initrd: Option<&[u8]>,
    fdt: &[u8],
) -> Result<(), MachineError> {
    let oom = |what: &str| MachineError(format!("{what} does not fit in guest RAM"));
    if fdt.len() as u64 > FDT_MAX_SIZE {
        return err("device tree is larger than 1 MiB");
    }
    let kernel_load = if let Some(fw) = firmware {
        ram.write(RAM_BASE, fw).map_err(|_| oom("firmware"))?;
        let (start, _, _) = kernel_span(true, kernel)?;
        Some(start)
    } else {
        None
    };
    if is_elf(kernel) {
        for seg in elf_segments(kernel)? {
            let data = &kernel[seg.file_off..seg.file_off + seg.file_len];
            ram.write(seg.paddr, data)
                .map_err(|_| MachineError(format!("ELF segment at {:#x} is outside guest RAM", seg.paddr)))?;
            let zeros = vec![0u8; (seg.mem_len - seg.file_len as u64) as usize];
            ram.write(seg.paddr + seg.file_len as u64, &zeros)
                .map_err(|_| MachineError(format!("ELF segment at {:#x} is outside guest RAM", seg.paddr)))?;
        }
    } else {
        let at = kernel_load.unwrap_or(RAM_BASE);
        ram.write(at, kernel).map_err(|_| oom("kernel"))?;
    }
    if let (Some(data), Some((start, _))) = (initrd, plan.initrd) {
        ram.write(start, data).map_err(|_| oom("initrd"))?;
    }
    ram.write(plan.fdt_addr, fdt).map_err(|_| oom("device tree"))?;
    if let Some(info) = plan.fw_dynamic_info {
        let (next, _, _) = kernel_span(true, kernel)?;
        let words = [FW_DYNAMIC_MAGIC, FW_DYNAMIC_VERSION, next, NEXT_MODE_S, 0, 0];
        for (i, w) in words.iter().enumerate() {
            ram.write_u64(info + 8 * i as u64, *w).map_err(|_| oom("boot info"))?;
        }
    }
    Ok(())
}

/// (load address, end address, entry) of the kernel or program.
fn kernel_span(with_firmware: bool, kernel: &[u8]) -> Result<(u64, u64, u64), MachineError> {
    if kernel.is_empty() {
        return err("kernel file is empty");
    }
    if is_elf(kernel) {
        let segs = elf_segments(kernel)?;
        let start = segs.iter().map(|s| s.paddr).min().unwrap_or(RAM_BASE);
        let end = segs.iter().map(|s| s.paddr + s.mem_len).max().unwrap_or(RAM_BASE);
        if start < RAM_BASE {
            return err(format!("ELF program loads at {start:#x}, below RAM at {RAM_BASE:#x}"));
        }
        return Ok((start, end, elf_entry(kernel)));
    }
    if !with_firmware {
        return Ok((RAM_BASE, RAM_BASE + kernel.len() as u64, RAM_BASE));
    }
    // A RISC-V Linux Image: text_offset at 8, image_size at 16, "RSC\x05" at 56.
    if kernel.len() >= 64 && &kernel[56..60] == b"RSC\x05" {
        let text_offset = u64::from_le_bytes(kernel[8..16].try_into().unwrap());
        let image_size = u64::from_le_bytes(kernel[16..24].try_into().unwrap());
        let text_offset = if text_offset == 0 { KERNEL_OFFSET } else { text_offset };
        if text_offset % (2 * MIB) != 0 || text_offset > (1 << 32) {
            return err(format!("kernel Image asks for an unusable load offset {text_offset:#x}"));
        }
        let start = RAM_BASE + text_offset;
        let size = image_size.max(kernel.len() as u64);
        return Ok((start, start + size, start));
    }
    if kernel.starts_with(&[0x1f, 0x8b]) {
        return err("kernel is gzip-compressed: give the uncompressed Image");
    }
    let start = RAM_BASE + KERNEL_OFFSET;
    Ok((start, start + kernel.len() as u64, start))
}

fn is_elf(b: &[u8]) -> bool {
    b.len() >= 4 && &b[..4] == b"\x7fELF"
}

struct Segment {
    paddr: u64,
    file_off: usize,
    file_len: usize,
    mem_len: u64,
}

fn rd16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn rd32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn rd64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn elf_entry(b: &[u8]) -> u64 {
    rd64(b, 24)
}

fn elf_segments(b: &[u8]) -> Result<Vec<Segment>, MachineError> {
    const EM_RISCV: u16 = 243;
    if b.len() < 64 {
        return err(format!("ELF file is truncated: {} bytes, shorter than its 64-byte header", b.len()));
    }
    if b[4] != 2 || b[5] != 1 {
        return err("ELF file is not 64-bit little-endian");
    }
    if rd16(b, 18) != EM_RISCV {
        return err("ELF file is not for RISC-V");
    }
    let phoff = rd64(b, 32) as usize;
    let phentsize = rd16(b, 54) as usize;
    let phnum = rd16(b, 56) as usize;
    if phentsize < 56 || phoff.checked_add(phentsize * phnum).is_none_or(|end| end > b.len()) {
        return err("ELF program headers are truncated");
    }
    let mut segs = Vec::new();
    for i in 0..phnum {
        let p = phoff + i * phentsize;
        if rd32(b, p) != 1 {
            continue; // not PT_LOAD
        }
        let file_off = rd64(b, p + 8) as usize;
        let paddr = rd64(b, p + 24);
        let file_len = rd64(b, p + 32) as usize;
        let mem_len = rd64(b, p + 40);
        if file_off.checked_add(file_len).is_none_or(|end| end > b.len()) || (file_len as u64) > mem_len {
            return err(format!("ELF segment {i} is truncated or malformed"));
        }
        if mem_len > (1 << 32) {
            return err(format!("ELF segment {i} is implausibly large"));
        }
        segs.push(Segment { paddr, file_off, file_len, mem_len });
    }
    if segs.is_empty() {
        return err("ELF file has no loadable segments");
    }
    Ok(segs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_small_ram_is_a_clear_error() {
        let ram = GuestRam::new(RAM_BASE, 8 * MIB);
        let mut kernel = vec![0u8; 64];
        kernel[56..60].copy_from_slice(b"RSC\x05");
        kernel[16..24].copy_from_slice(&(20 * MIB).to_le_bytes());
        let e = plan(&ram, Some(&[0u8; 4096]), &kernel, None).unwrap_err();
        assert!(e.0.contains("too small"), "{}", e.0);
    }

    #[test]
    fn truncated_elf_is_refused() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[18] = 243;
        elf[32] = 64; // phoff
        elf[54] = 56; // phentsize
        elf[56] = 4; // phnum, but no room for them
        let ram = GuestRam::new(RAM_BASE, 16 * MIB);
        assert!(plan(&ram, None, &elf, None).is_err());
    }

    #[test]
    fn image_goes_at_its_text_offset_and_initrd_below_fdt() {
        let ram = GuestRam::new(RAM_BASE, 256 * MIB);
        let mut kernel = vec![0u8; 4096];
        kernel[56..60].copy_from_slice(b"RSC\x05");
        kernel[8..16].copy_from_slice(&(2 * MIB).to_le_bytes());
        let (p, kstart) = plan(&ram, Some(&[1u8; 100]), &kernel, Some(&[2u8; 5000])).unwrap();
        assert_eq!(kstart, RAM_BASE + 2 * MIB);
        assert_eq!(p.entry, RAM_BASE);
        let (s, e) = p.initrd.unwrap();
        assert_eq!(e - s, 5000);
        assert!(e <= p.fdt_addr);
    }
}
