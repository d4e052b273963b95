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
use ftvm_memory::GuestRam;

const MIB: u64 = 1 << 20;
/// Space reserved at the top of RAM for the device tree and boot info.
const FDT_REGION: u64 = 2 * MIB;
pub const FDT_MAX_SIZE: u64 = MIB;
/// OpenSBI's fw_dynamic_info magic ("OSBI") and the version we fill in.
const FW_DYNAMIC_MAGIC: u64 = 0x4942_534f;
const FW_DYNAMIC_VERSION: u64 = 2;
const NEXT_MODE_S: u64 = 1;

/// Why a kernel, firmware or initrd cannot be put in guest RAM: a file
/// that is not what it must be, or RAM too small for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("{ram_mib} MiB of RAM is too small to boot anything")]
    RamTooSmall { ram_mib: u64 },
    #[error("{ram_mib} MiB of RAM is too small for this kernel")]
    RamTooSmallForKernel { ram_mib: u64 },
    #[error("{ram_mib} MiB of RAM is too small for this kernel and initrd (need at least {need_mib} MiB)")]
    RamTooSmallForInitrd { ram_mib: u64, need_mib: u64 },
    #[error("firmware of {len} bytes overlaps the kernel at {kernel:#x}")]
    FirmwareOverlapsKernel { len: usize, kernel: u64 },
    #[error("device tree is larger than 1 MiB")]
    DeviceTreeTooLarge,
    /// `what`: "firmware", "kernel", "initrd", "device tree", "boot info".
    #[error("{what} does not fit in guest RAM")]
    DoesNotFit { what: &'static str },
    #[error("ELF segment at {paddr:#x} is outside guest RAM")]
    SegmentOutsideRam { paddr: u64 },
    #[error("kernel file is empty")]
    EmptyKernel,
    #[error("ELF program loads at {start:#x}, below RAM at {RAM_BASE:#x}")]
    BelowRam { start: u64 },
    #[error("kernel Image asks for an unusable load offset {0:#x}")]
    LoadOffset(u64),
    #[error("kernel is gzip-compressed: give the uncompressed Image")]
    Compressed,
    #[error("ELF file is truncated: {len} bytes, shorter than its 64-byte header")]
    ElfTruncated { len: usize },
    #[error("ELF file is not 64-bit little-endian")]
    ElfClass,
    #[error("ELF file is not for RISC-V")]
    ElfMachine,
    #[error("ELF program headers are truncated")]
    ElfProgramHeaders,
    #[error("ELF segment {0} is truncated or malformed")]
    ElfSegment(usize),
    #[error("ELF segment {0} is implausibly large")]
    ElfSegmentSize(usize),
    #[error("ELF file has no loadable segments")]
    ElfNoSegments,
    #[error("firmware file is empty")]
    EmptyFirmware,
    #[error("firmware is an ELF file: give its flat binary (e.g. fw_dynamic.bin, not fw_dynamic.elf)")]
    FirmwareElf,
    #[error("firmware is gzip-compressed: give the uncompressed binary")]
    FirmwareCompressed,
    /// A Linux Image shorter than the data its PE header places in the file.
    #[error("kernel Image is truncated: {len} bytes, but its header places data up to byte {need}")]
    ImageTruncated { len: usize, need: u64 },
    /// A flat binary (neither a Linux Image nor an ELF file) must start
    /// with code: `what` is "firmware" or "kernel".
    #[error(
        "{what} is not a RISC-V program (not a Linux Image, not an ELF file, and as a flat binary \
         its bytes at offset {offset:#x}, {bits:#x}, are no RV64GC instruction)"
    )]
    NotAProgram { what: &'static str, offset: usize, bits: u32 },
    #[error("{what} is not a RISC-V program: it ends inside an instruction at offset {offset:#x}")]
    FlatCut { what: &'static str, offset: usize },
    #[error("{what} is not a RISC-V program: its jump at offset {offset:#x} leaves the file")]
    FlatJumpsOut { what: &'static str, offset: usize },
}

/// How many instructions of a flat binary are checked from its start.
/// Most random parcels decode as some instruction, so it takes a run of
/// them to tell: with this rule 7 of 2000 random 64 KiB files pass for
/// code (the test `random_bytes_rarely_pass_for_code`); real code always
/// passes.
const FLAT_CHECKED: usize = 32;

/// What a flat binary must satisfy to be started: it is entered at its
/// first byte, and the instructions from there must be RV64GC
/// instructions, followed through jumps whose target their bits give (a
/// jump over a header), up to `FLAT_CHECKED` of them, the end of the file
/// (a jump out of it is refused), or an instruction after which control goes where
/// its bits do not say (`ret`, `mret`: data may follow). A flat binary has
/// no header to check; this refuses data (random bytes, zeros, text, a
/// file cut inside its first instruction) before the guest runs it.
fn check_flat(what: &'static str, bytes: &[u8]) -> Result<(), LoadError> {
    use ftvm_cpu::{peek_instruction, Flow, Peek};
    let mut offset = 0;
    for _ in 0..FLAT_CHECKED {
        if offset >= bytes.len() {
            break;
        }
        match peek_instruction(&bytes[offset..]) {
            Peek::Instruction { flow: Flow::Next, len } => offset += len,
            Peek::Instruction { flow: Flow::Jump(by), .. } => match offset.checked_add_signed(by as isize) {
                Some(to) if to < bytes.len() => offset = to,
                _ => return Err(LoadError::FlatJumpsOut { what, offset }),
            },
            Peek::Instruction { flow: Flow::Unknown, .. } => break,
            Peek::Invalid(bits) => return Err(LoadError::NotAProgram { what, offset, bits }),
            Peek::Cut => return Err(LoadError::FlatCut { what, offset }),
        }
    }
    Ok(())
}

/// Firmware is a flat binary put at the start of RAM, where every hart
/// starts.
fn check_firmware(fw: &[u8]) -> Result<(), LoadError> {
    if fw.is_empty() {
        return Err(LoadError::EmptyFirmware);
    }
    if is_elf(fw) {
        return Err(LoadError::FirmwareElf);
    }
    if fw.starts_with(&[0x1f, 0x8b]) {
        return Err(LoadError::FirmwareCompressed);
    }
    check_flat("firmware", fw)
}

/// A Linux Image with an EFI stub ("MZ" at 0, the PE header's offset at
/// 0x3c, as Debian's riscv64 kernel has) says in its PE section table
/// where its data ends in the file: a shorter file was cut. An Image
/// without the stub carries no length of its own to check.
fn check_image_length(kernel: &[u8]) -> Result<(), LoadError> {
    let cut = |need: u64| LoadError::ImageTruncated { len: kernel.len(), need };
    if !kernel.starts_with(b"MZ") {
        return Ok(());
    }
    let pe = rd32(kernel, 0x3c) as usize;
    if kernel.get(pe..pe + 4) != Some(b"PE\0\0") {
        return Ok(());
    }
    let Some(coff) = kernel.get(pe + 4..pe + 24) else { return Err(cut(pe as u64 + 24)) };
    let sections = u16::from_le_bytes([coff[2], coff[3]]) as usize;
    let optional = u16::from_le_bytes([coff[16], coff[17]]) as usize;
    let table = pe + 24 + optional;
    let table_end = table + 40 * sections;
    if table_end > kernel.len() {
        return Err(cut(table_end as u64));
    }
    let data_end = (0..sections)
        .map(|i| {
            let s = table + 40 * i;
            let (size, at) = (rd32(kernel, s + 16) as u64, rd32(kernel, s + 20) as u64);
            if size == 0 {
                0
            } else {
                at + size
            }
        })
        .max()
        .unwrap_or(0);
    if data_end > kernel.len() as u64 {
        return Err(cut(data_end));
    }
    Ok(())
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
) -> Result<(BootPlan, u64), LoadError> {
    let ram_mib = ram.size() / MIB;
    if ram.size() < 2 * FDT_REGION {
        return Err(LoadError::RamTooSmall { ram_mib });
    }
    let fdt_addr = ram.end() - FDT_REGION;
    let kernel_span = kernel_span(firmware.is_some(), kernel)?;
    let mut lowest_free = kernel_span.1;
    if let Some(fw) = firmware {
        let fw_end = RAM_BASE + fw.len() as u64;
        if fw_end > kernel_span.0 {
            return Err(LoadError::FirmwareOverlapsKernel { len: fw.len(), kernel: kernel_span.0 });
        }
        lowest_free = lowest_free.max(fw_end);
    }
    let initrd_range = match initrd {
        Some(data) => {
            let start = (fdt_addr - data.len() as u64) & !0xfff;
            if data.len() as u64 > fdt_addr || start < lowest_free {
                let need_mib = (kernel_span.1 - RAM_BASE + data.len() as u64 + FDT_REGION).div_ceil(MIB) + 1;
                return Err(LoadError::RamTooSmallForInitrd { ram_mib, need_mib });
            }
            Some((start, start + data.len() as u64))
        }
        None => None,
    };
    if lowest_free > fdt_addr {
        return Err(LoadError::RamTooSmallForKernel { ram_mib });
    }
    if let Some(fw) = firmware {
        check_firmware(fw)?;
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
) -> Result<(), LoadError> {
    let oom = |what| LoadError::DoesNotFit { what };
    if fdt.len() as u64 > FDT_MAX_SIZE {
        return Err(LoadError::DeviceTreeTooLarge);
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
            let outside = |_| LoadError::SegmentOutsideRam { paddr: seg.paddr };
            ram.write(seg.paddr, data).map_err(outside)?;
            let zeros = vec![0u8; (seg.mem_len - seg.file_len as u64) as usize];
            ram.write(seg.paddr + seg.file_len as u64, &zeros).map_err(outside)?;
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
fn kernel_span(with_firmware: bool, kernel: &[u8]) -> Result<(u64, u64, u64), LoadError> {
    if kernel.is_empty() {
        return Err(LoadError::EmptyKernel);
    }
    if is_elf(kernel) {
        let segs = elf_segments(kernel)?;
        let start = segs.iter().map(|s| s.paddr).min().unwrap_or(RAM_BASE);
        let end = segs.iter().map(|s| s.paddr + s.mem_len).max().unwrap_or(RAM_BASE);
        if start < RAM_BASE {
            return Err(LoadError::BelowRam { start });
        }
        return Ok((start, end, elf_entry(kernel)));
    }
    if !with_firmware {
        check_flat("kernel", kernel)?;
        return Ok((RAM_BASE, RAM_BASE + kernel.len() as u64, RAM_BASE));
    }
    // A RISC-V Linux Image: text_offset at 8, image_size at 16, "RSC\x05" at 56.
    if kernel.len() >= 64 && &kernel[56..60] == b"RSC\x05" {
        let text_offset = u64::from_le_bytes(kernel[8..16].try_into().unwrap());
        let image_size = u64::from_le_bytes(kernel[16..24].try_into().unwrap());
        let text_offset = if text_offset == 0 { KERNEL_OFFSET } else { text_offset };
        if text_offset % (2 * MIB) != 0 || text_offset > (1 << 32) {
            return Err(LoadError::LoadOffset(text_offset));
        }
        check_image_length(kernel)?;
        let start = RAM_BASE + text_offset;
        let size = image_size.max(kernel.len() as u64);
        return Ok((start, start + size, start));
    }
    if kernel.starts_with(&[0x1f, 0x8b]) {
        return Err(LoadError::Compressed);
    }
    // A flat payload the firmware starts in S-mode.
    check_flat("kernel", kernel)?;
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

fn elf_segments(b: &[u8]) -> Result<Vec<Segment>, LoadError> {
    const EM_RISCV: u16 = 243;
    if b.len() < 64 {
        return Err(LoadError::ElfTruncated { len: b.len() });
    }
    if b[4] != 2 || b[5] != 1 {
        return Err(LoadError::ElfClass);
    }
    if rd16(b, 18) != EM_RISCV {
        return Err(LoadError::ElfMachine);
    }
    let phoff = rd64(b, 32) as usize;
    let phentsize = rd16(b, 54) as usize;
    let phnum = rd16(b, 56) as usize;
    if phentsize < 56 || phoff.checked_add(phentsize * phnum).is_none_or(|end| end > b.len()) {
        return Err(LoadError::ElfProgramHeaders);
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
            return Err(LoadError::ElfSegment(i));
        }
        if mem_len > (1 << 32) {
            return Err(LoadError::ElfSegmentSize(i));
        }
        segs.push(Segment { paddr, file_off, file_len, mem_len });
    }
    if segs.is_empty() {
        return Err(LoadError::ElfNoSegments);
    }
    Ok(segs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_small_ram_is_a_clear_error() {
        let ram = GuestRam::new(RAM_BASE, 8 * MIB).unwrap();
        let mut kernel = vec![0u8; 64];
        kernel[56..60].copy_from_slice(b"RSC\x05");
        kernel[16..24].copy_from_slice(&(20 * MIB).to_le_bytes());
        let e = plan(&ram, Some(&[0u8; 4096]), &kernel, None).unwrap_err();
        assert!(matches!(e, LoadError::RamTooSmallForKernel { ram_mib: 8 }), "{e:?}");
        assert!(e.to_string().contains("too small"), "{e}");
    }

    /// How often random bytes pass for a flat program (the comment on
    /// `FLAT_CHECKED` quotes this).
    #[test]
    fn random_bytes_rarely_pass_for_code() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut passed = 0;
        let files = 2_000;
        for _ in 0..files {
            let bytes: Vec<u8> = (0..64 << 10)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            passed += check_flat("kernel", &bytes).is_ok() as usize;
        }
        eprintln!("{passed} of {files} random files pass for code");
        assert!(passed * 100 < files, "{passed} of {files} random files pass for code");
    }

    #[test]
    fn flat_programs_that_pass_and_fail() {
        let words = |w: &[u32]| w.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>();
        // wfi; j . (and a tiny program that falls off its end)
        assert_eq!(check_flat("kernel", &words(&[0x1050_0073, 0x0000_006f])), Ok(()));
        assert_eq!(check_flat("kernel", &words(&[0x1050_0073])), Ok(()));
        // j +8 over a data word, then addi a0, a0, 1; ret
        assert_eq!(check_flat("kernel", &words(&[0x0080_006f, 0xffff_ffff, 0x0015_0513, 0x0000_8067])), Ok(()));
        // j -4 from the first byte, and j +8 past the end
        let e = check_flat("kernel", &words(&[0xffdf_f06f])).unwrap_err();
        assert_eq!(e, LoadError::FlatJumpsOut { what: "kernel", offset: 0 });
        assert!(check_flat("kernel", &words(&[0x0080_006f])).is_err());
        // zeros, and text
        assert!(matches!(check_flat("firmware", &[0u8; 64]), Err(LoadError::NotAProgram { offset: 0, .. })));
        assert!(check_flat("kernel", b"#!/bin/sh\necho this is a script, not a program\n").is_err());
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
        let ram = GuestRam::new(RAM_BASE, 16 * MIB).unwrap();
        assert!(plan(&ram, None, &elf, None).is_err());
    }

    #[test]
    fn image_goes_at_its_text_offset_and_initrd_below_fdt() {
        let ram = GuestRam::new(RAM_BASE, 256 * MIB).unwrap();
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
