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
    let elf = Elf::new(elf);
    let mut sizes = Vec::new();
    let mut reserved = false;
    for section in elf.sections() {
        let name = section.name;
        if name.starts_with(b".nv.shared.reserved.") {
            reserved = true;
        } else if let Some(kernel) = name.strip_prefix(b".nv.shared.") {
            sizes.push((String::from_utf8_lossy(kernel).into_owned(), section.size));
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
    let elf = Elf::new(elf);
    let sections = elf.sections();
    let mut names = Vec::new();
    // SHT_SYMTAB, whose sh_link is its string table.
    for symtab in sections.iter().filter(|s| s.kind == 2) {
        let strtab = sections[symtab.link].offset;
        for sym in (symtab.offset..symtab.offset + symtab.size).step_by(symtab.entsize) {
            let info = elf.bytes[sym + 4];
            // STB_GLOBAL, STT_FUNC.
            if info >> 4 == 1 && info & 0xf == 2 {
                let name = elf.c_str(strtab + elf.u32_at(sym));
                names.push(String::from_utf8_lossy(name).into_owned());
            }
        }
    }
    names
}

/// A 64-bit little-endian ELF image (a CUBIN), read just far enough for
/// the checks above: its section headers and NUL-terminated names.
struct Elf<'a> {
    bytes: &'a [u8],
}

/// The fields of a section header the checks read, its name resolved.
struct Section<'a> {
    name: &'a [u8],
    kind: u32, // sh_type
    offset: usize,
    size: usize,
    link: usize,
    entsize: usize,
}

impl<'a> Elf<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        assert_eq!(bytes[4], 2, "a 64-bit ELF");
        Elf { bytes }
    }
    fn u16_at(&self, at: usize) -> usize {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]]) as usize
    }
    fn u32_at(&self, at: usize) -> usize {
        u32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap()) as usize
    }
    fn u64_at(&self, at: usize) -> usize {
        u64::from_le_bytes(self.bytes[at..at + 8].try_into().unwrap()) as usize
    }
    /// The section headers, in order (e_shoff, e_shentsize, e_shnum),
    /// named from the string table e_shstrndx picks.
    fn sections(&self) -> Vec<Section<'a>> {
        let (shoff, shentsize, shnum) = (self.u64_at(0x28), self.u16_at(0x3A), self.u16_at(0x3C));
        let names = self.u64_at(shoff + self.u16_at(0x3E) * shentsize + 0x18);
        (0..shnum)
            .map(|i| {
                let sh = shoff + i * shentsize;
                Section {
                    name: self.c_str(names + self.u32_at(sh)),
                    kind: self.u32_at(sh + 4) as u32,
                    offset: self.u64_at(sh + 0x18),
                    size: self.u64_at(sh + 0x20),
                    link: self.u32_at(sh + 0x28),
                    entsize: self.u64_at(sh + 0x38),
                }
            })
            .collect()
    }
    /// The NUL-terminated string at `at` (without its NUL).
    fn c_str(&self, at: usize) -> &'a [u8] {
        let s = &self.bytes[at..];
        &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())]
    }
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
