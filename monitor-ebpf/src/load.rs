//! Word loads from packet memory.
//!
//! Header fields are byte arrays (alignment 1), and without the
//! `allows-misaligned-mem-access` CPU feature, which aya-build's flags leave no room to pass,
//! LLVM splits every wide load from them into single bytes: 8 loads and 14 shifts and ors for a
//! u64. The kernel accepts misaligned packet loads on architectures with efficient unaligned
//! access (x86-64, arm64), so one instruction does it.

use core::arch::asm;

/// Native-endian u64 at `p`. The caller has bounds-checked 8 bytes against data_end.
#[inline(always)]
pub unsafe fn u64_at(p: *const u8) -> u64 {
    let v: u64;
    unsafe {
        asm!("{0} = *(u64 *)({1} + 0)", lateout(reg) v, in(reg) p, options(readonly, nostack, preserves_flags))
    };
    v
}

/// Native-endian u32 at `p`, zero-extended. The caller has bounds-checked 4 bytes.
#[inline(always)]
pub unsafe fn u32_at(p: *const u8) -> u64 {
    let v: u64;
    unsafe {
        asm!("{0} = *(u32 *)({1} + 0)", lateout(reg) v, in(reg) p, options(readonly, nostack, preserves_flags))
    };
    v
}
