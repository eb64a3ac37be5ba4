//! Every kernel compiles with NVRTC to CUBIN for sm_80 and sm_90 (no GPU needed;
//! skips with a message when NVRTC cannot be loaded).

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    if !turbospark_cuda::nvrtc::nvrtc_available() {
        eprintln!("skipped: NVRTC (libnvrtc.so.13) not found; scripts/test.sh installs it");
        return;
    }
    for (major, minor) in [(8, 0), (9, 0)] {
        let started = std::time::Instant::now();
        let cubins = match turbospark_cuda::nvrtc::compile(major, minor) {
            Ok(c) => c,
            Err(e) => panic!("sm_{major}{minor}: {e}"),
        };
        assert_eq!(cubins.len(), turbospark_cuda::nvrtc::PROGRAMS.len());
        // Each program's kernels are its own: no kernel is emitted by two
        // programs (its files' kernels are templates never instantiated
        // in the others, common.cuh `KERNEL`).
        let mut owner = std::collections::HashMap::new();
        let mut static_smem = std::collections::HashMap::new();
        for (p, cubin) in cubins.iter().enumerate() {
            static_smem.extend(static_shared_bytes(cubin));
            // An ELF image (what the driver loads).
            assert_eq!(
                &cubin[..4],
                b"\x7fELF",
                "sm_{major}{minor}: program {p} is not a CUBIN"
            );
            let kernels = kernel_names(cubin);
            assert!(
                !kernels.is_empty(),
                "sm_{major}{minor}: program {p} holds no kernel"
            );
            for k in kernels {
                if let Some(q) = owner.insert(k.clone(), p) {
                    panic!("sm_{major}{minor}: kernel {k} is in programs {q} and {p}");
                }
            }
        }
        eprintln!(
            "sm_{major}{minor}: {} kernels in {} programs, {} bytes of CUBIN, {:.1} s on {} threads",
            owner.len(),
            cubins.len(),
            cubins.iter().map(Vec::len).sum::<usize>(),
            started.elapsed().as_secs_f64(),
            turbospark_cuda::nvrtc::compile_threads(cubins.len())
        );
        assert!(owner.contains_key("rms_norm") && owner.contains_key("kq_tile_q6_k"));
        // What the kernels' loading asks of the driver beyond 48 KiB of
        // dynamic shared memory fits the architecture's opt-in limit a
        // block (the A100's 163 KiB, the H100's 227 KiB: CUDA C++
        // Programming Guide, "Technical Specifications per Compute
        // Capability") with the kernel's static shared memory; the
        // driver refuses more (CUDA_ERROR_INVALID_VALUE, and no session
        // starts).
        let optin = if major == 8 { 163 * 1024 } else { 227 * 1024 };
        for (name, dynamic) in turbospark_cuda::dynamic_shared_requests(optin) {
            assert!(
                owner.contains_key(name),
                "sm_{major}{minor}: no kernel {name}"
            );
            let fixed = static_smem.get(name).copied().unwrap_or(0);
            assert!(
                fixed + dynamic <= optin,
                "sm_{major}{minor}: {name} asks for {dynamic} bytes of dynamic shared memory \
                 beside its {fixed} static bytes, past the {optin}-byte opt-in limit"
            );
        }
    }
}

/// Each kernel's static shared memory (bytes) in a CUBIN, as the driver
/// counts it against the opt-in limit: the size of its
/// `.nv.shared.<kernel>` section (kernels with none have no section), less
/// the 1 KiB a block the driver reserves for itself where the CUBIN counts
/// that in each kernel's section — ptxas 13.0 for sm_90 does, marking it
/// with a `.nv.shared.reserved.0` section (`attention_f32`: 640 bytes by
/// `ptxas -v`, a section of 1664; for sm_80 a section of 640).
fn static_shared_bytes(elf: &[u8]) -> Vec<(String, usize)> {
    const RESERVED: usize = 1024;
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3A), u16_at(0x3C));
    let section = |i: usize| shoff + i * shentsize;
    let names = u64_at(section(u16_at(0x3E)) + 0x18);
    let mut sizes = Vec::new();
    let mut reserved = false;
    for i in 0..shnum {
        let sh = section(i);
        let name = &elf[names + u32_at(sh)..];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        if name.starts_with(b".nv.shared.reserved.") {
            reserved = true;
        } else if let Some(kernel) = name.strip_prefix(b".nv.shared.") {
            sizes.push((
                String::from_utf8_lossy(kernel).into_owned(),
                u64_at(sh + 0x20),
            ));
        }
    }
    if reserved {
        for (kernel, size) in &mut sizes {
            assert!(
                *size >= RESERVED,
                "{kernel}'s shared section ({size} bytes) lacks the reserved 1 KiB"
            );
            *size -= RESERVED;
        }
    }
    sizes
}

/// The kernels (global functions) a CUBIN defines: the names of its ELF
/// symbol table's global function symbols.
fn kernel_names(elf: &[u8]) -> Vec<String> {
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    assert_eq!(elf[4], 2, "a 64-bit ELF");
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3A), u16_at(0x3C));
    let section = |i: usize| shoff + i * shentsize;
    let mut names = Vec::new();
    for i in 0..shnum {
        let sh = section(i);
        // SHT_SYMTAB, whose sh_link is its string table.
        if u32_at(sh + 4) != 2 {
            continue;
        }
        let (offset, size, entsize) = (u64_at(sh + 0x18), u64_at(sh + 0x20), u64_at(sh + 0x38));
        let strtab = u64_at(section(u32_at(sh + 0x28)) + 0x18);
        for sym in (offset..offset + size).step_by(entsize) {
            let info = elf[sym + 4];
            // STB_GLOBAL, STT_FUNC.
            if info >> 4 == 1 && info & 0xf == 2 {
                let name = &elf[strtab + u32_at(sym)..];
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                names.push(String::from_utf8_lossy(&name[..end]).into_owned());
            }
        }
    }
    names
}

#[test]
fn a_kernel_that_fails_to_compile_is_a_clear_error() {
    if !turbospark_cuda::nvrtc::nvrtc_available() {
        eprintln!("skipped: NVRTC (libnvrtc.so.13) not found; scripts/test.sh installs it");
        return;
    }
    let src = "extern \"C\" __global__ void broken(float* x) { x[0] = not_declared; }".to_string();
    match turbospark_cuda::nvrtc::compile_source(src, 9, 0) {
        Err(e @ turbospark_cuda::CudaError::Compile { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("sm_90"), "{msg}");
            assert!(
                msg.contains("not_declared"),
                "NVRTC's log names the culprit: {msg}"
            );
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn the_stage_sync_experiment_compiles_for_sm80_and_sm90() {
    if !turbospark_cuda::nvrtc::nvrtc_available() {
        eprintln!("skipped: NVRTC (libnvrtc.so.13) not found; scripts/test.sh installs it");
        return;
    }
    // examples/stage_sync.rs compiles it, after common.cuh, on the GPU's
    // machine.
    let src = concat!(
        include_str!("../src/kernels/common.cuh"),
        include_str!("../examples/stage_sync.cu")
    );
    for (major, minor) in [(8, 0), (9, 0)] {
        match turbospark_cuda::nvrtc::compile_source(src.to_string(), major, minor) {
            Ok(cubin) => assert_eq!(&cubin[..4], b"\x7fELF", "sm_{major}{minor}: not a CUBIN"),
            Err(e) => panic!("sm_{major}{minor}: {e}"),
        }
    }
}
