//! Greedy continuation of a token sequence on the CPU backend, printing the
//! token ids (and their text when the install carries a GGUF vocabulary),
//! the top-1 log-probability and the decode rate. A sanity tool, not a
//! sampler:
//!
//! ```text
//! cargo run --release -p turbospark-engine --example greedy -- INSTALL 504,3575,282 [N]
//! ```

use std::time::Instant;
use turbospark_cpu::CpuDevice;
use turbospark_engine::{Logits, Model, SessionOptions};
use turbospark_format::install::Install;

fn piece(vocab: &Option<Vec<String>>, id: u32) -> String {
    vocab
        .as_ref()
        .and_then(|v| v.get(id as usize))
        .map(|s| s.replace('Ġ', " ").replace('Ċ', "\n").replace('▁', " "))
        .unwrap_or_else(|| format!("<{id}>"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, ids, rest @ ..] = args.as_slice() else {
        return Err("usage: greedy INSTALL ID,ID,... [N]".into());
    };
    let n: usize = rest.first().map_or(Ok(16), |s| s.parse())?;
    let prompt: Vec<u32> = ids.split(',').map(str::parse).collect::<Result<_, _>>()?;
    let install = Install::open(std::path::Path::new(dir))?;
    let vocab: Option<Vec<String>> = std::fs::read(install.dir.join("vocab.gguf.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| serde_json::from_value(v["tokens"].clone()).ok());
    let model = Model::load(&install, CpuDevice::with_available_threads()?)?;
    let v = model.vocab_size();
    let mut s = model.session(SessionOptions::new(prompt.len() + n))?;
    let mut logits = vec![0f32; v];
    let t0 = Instant::now();
    s.forward(0, &prompt, Logits::Last(&mut logits))?;
    let prefill = t0.elapsed();
    let text: String = prompt.iter().map(|&t| piece(&vocab, t)).collect();
    println!("prompt: {text:?}");
    let t1 = Instant::now();
    let mut out = Vec::new();
    for i in 0..n {
        let (best, &max) =
            logits.iter().enumerate().fold(
                (0, &f32::NEG_INFINITY),
                |a, b| if b.1 > a.1 { b } else { a },
            );
        let lse = max + logits.iter().map(|&z| (z - max).exp()).sum::<f32>().ln();
        println!(
            "{i:>3}: {best:>6} {:<16} logprob {:.4}",
            format!("{:?}", piece(&vocab, best as u32)),
            max - lse
        );
        out.push(best as u32);
        if i + 1 < n {
            logits.copy_from_slice(s.decode(best as u32, prompt.len() + i)?);
        }
    }
    let decode = t1.elapsed();
    let text: String = out.iter().map(|&t| piece(&vocab, t)).collect();
    println!("continuation: {text:?}");
    println!("ids: {out:?}");
    println!(
        "prefill {} tokens in {:.1} ms; decode {:.1} tokens/s",
        prompt.len(),
        prefill.as_secs_f64() * 1e3,
        (n.max(1) - 1) as f64 / decode.as_secs_f64()
    );
    Ok(())
}
