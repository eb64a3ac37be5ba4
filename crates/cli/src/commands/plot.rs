//! `turbospark plot`: pictures of what `bench` and `--router-hist` wrote,
//! as SVG or PNG, drawn with `plotters`.
//!
//! - `plot router-hist FILE.json --out FILE.svg`: a heatmap, one row per
//!   MoE layer and one column per expert, each cell shaded by the expert's
//!   share of its layer's selections (white: never chosen; darkest: the
//!   layer's most chosen), from the JSON of `--router-hist`
//!   (`{num_experts, top_k, layers: [{layer, counts}]}`).
//! - `plot sweep FILE.jsonl --out FILE.svg`: cache hit rate and decode
//!   tok/s against the number of expert slots, from `bench --sweep --json`
//!   (one object per configuration; the streamed ones have `slots`).
//!
//! The format is `--format svg|png`, or else the extension of `--out`. A
//! PNG is drawn by plotters' bitmap backend into an RGB buffer, its text
//! rasterized by `ab_glyph` from a font built into the binary (DejaVu Sans
//! cut to ASCII, `crates/cli/assets`, so a PNG looks the same on every
//! machine, fonts installed or not), and encoded by the `png` crate.

use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
    /// The picture format (default: the extension of --out, .svg or .png).
    #[arg(long, value_enum, global = true)]
    pub format: Option<Format>,
}

/// A picture format `plot` writes.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// `flag` when given, else the format `out`'s extension names.
    pub fn choose(flag: Option<Format>, out: &Path) -> Result<Format, PlotError> {
        if let Some(f) = flag {
            return Ok(f);
        }
        let ext = out.extension().and_then(|e| e.to_str()).unwrap_or("");
        match ext.to_ascii_lowercase().as_str() {
            "svg" => Ok(Format::Svg),
            "png" => Ok(Format::Png),
            _ => Err(PlotError::Format {
                path: out.to_path_buf(),
            }),
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum What {
    /// A per-layer × per-expert heatmap of a router histogram
    /// (`--router-hist FILE.json`).
    RouterHist {
        /// The histogram JSON.
        input: PathBuf,
        /// The picture to write (.svg or .png).
        #[arg(long)]
        out: PathBuf,
    },
    /// Hit rate and decode tok/s against slot count, from `bench --sweep
    /// --json` output (one JSON object per line).
    Sweep {
        /// The sweep's JSON lines.
        input: PathBuf,
        /// The picture to write (.svg or .png).
        #[arg(long)]
        out: PathBuf,
    },
}

/// What is wrong with a plot's input.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}, line {line}: not JSON")]
    Json {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {field}: expected {expected}")]
    Field {
        path: PathBuf,
        field: String,
        expected: &'static str,
    },
    #[error("{path}: {what}")]
    Empty { path: PathBuf, what: &'static str },
    #[error("drawing {path}: {detail}")]
    Draw { path: PathBuf, detail: String },
    #[error("{path}: cannot tell the picture format from the extension; name it .svg or .png, or pass --format svg|png")]
    Format { path: PathBuf },
}

/// A router histogram: `counts[layer row][expert]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterHist {
    pub num_experts: usize,
    pub layers: Vec<(usize, Vec<u64>)>,
}

fn field_err(path: &Path, field: impl Into<String>, expected: &'static str) -> PlotError {
    PlotError::Field {
        path: path.to_path_buf(),
        field: field.into(),
        expected,
    }
}

fn read(path: &Path) -> Result<String, PlotError> {
    std::fs::read_to_string(path).map_err(|source| PlotError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl RouterHist {
    /// Parses the JSON `--router-hist` writes.
    pub fn parse(path: &Path, text: &str) -> Result<RouterHist, PlotError> {
        let v: Value = serde_json::from_str(text).map_err(|source| PlotError::Json {
            path: path.to_path_buf(),
            line: 1,
            source,
        })?;
        let num_experts = v["num_experts"]
            .as_u64()
            .filter(|&n| n > 0)
            .ok_or_else(|| field_err(path, "num_experts", "a positive integer"))?
            as usize;
        let layers = v["layers"]
            .as_array()
            .ok_or_else(|| field_err(path, "layers", "an array"))?;
        let mut out = Vec::with_capacity(layers.len());
        for (i, l) in layers.iter().enumerate() {
            let layer = l["layer"]
                .as_u64()
                .ok_or_else(|| field_err(path, format!("layers[{i}].layer"), "an integer"))?;
            let counts = l["counts"]
                .as_array()
                .filter(|c| c.len() == num_experts)
                .ok_or_else(|| {
                    field_err(
                        path,
                        format!("layers[{i}].counts"),
                        "an array of num_experts counts",
                    )
                })?
                .iter()
                .map(|c| c.as_u64())
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| {
                    field_err(path, format!("layers[{i}].counts"), "non-negative integers")
                })?;
            out.push((layer as usize, counts));
        }
        if out.is_empty() {
            return Err(PlotError::Empty {
                path: path.to_path_buf(),
                what: "the histogram has no layers",
            });
        }
        Ok(RouterHist {
            num_experts,
            layers: out,
        })
    }
}

/// One streamed configuration of a sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepPoint {
    pub slots: u64,
    pub hit_rate: f64,
    pub decode_tps: f64,
}

/// The streamed configurations of `bench --sweep --json` output, by slot
/// count (resident and mapped lines, without `slots`, are left out).
pub fn parse_sweep(path: &Path, text: &str) -> Result<Vec<SweepPoint>, PlotError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|source| PlotError::Json {
            path: path.to_path_buf(),
            line: i + 1,
            source,
        })?;
        if v["test"] != "sweep" {
            continue;
        }
        let Some(slots) = v["slots"].as_u64() else {
            continue;
        };
        let num = |f: &str| {
            v[f].as_f64()
                .ok_or_else(|| field_err(path, format!("line {}: {f}", i + 1), "a number"))
        };
        out.push(SweepPoint {
            slots,
            hit_rate: num("hit_rate")?,
            decode_tps: num("decode_tok_per_s")?,
        });
    }
    if out.is_empty() {
        return Err(PlotError::Empty {
            path: path.to_path_buf(),
            what: "no streamed configurations (lines of `bench --sweep --json` with `slots`)",
        });
    }
    out.sort_by_key(|p| p.slots);
    Ok(out)
}

/// The font every picture's text is set in: DejaVu Sans, printable ASCII
/// only (`scripts/fonts/make_ascii_font.sh`).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans-ASCII.ttf");

/// Registers [`FONT`] as plotters' "sans-serif" (once per process).
fn register_font(out: &Path) -> Result<(), PlotError> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Draw {
            path: out.to_path_buf(),
            detail: "the built-in font does not parse".into(),
        })
    }
}

/// A picture: its size in pixels and how to draw it on any backend.
trait Picture {
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// A drawing error as text (the backends' error types differ).
fn text<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
}

/// Draws `p` into `out` as `format`.
fn write_picture(p: &impl Picture, out: &Path, format: Format) -> Result<(), PlotError> {
    register_font(out)?;
    let err = |detail: String| PlotError::Draw {
        path: out.to_path_buf(),
        detail,
    };
    let (w, h) = p.size();
    match format {
        Format::Svg => {
            let root = SVGBackend::new(out, (w, h)).into_drawing_area();
            p.draw(&root).map_err(err)?;
            root.present().map_err(|e| err(text(e)))
        }
        Format::Png => {
            let mut rgb = vec![0u8; w as usize * h as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
                p.draw(&root).map_err(err)?;
                root.present().map_err(|e| err(text(e)))?;
            }
            write_png(out, (w, h), &rgb).map_err(|e| err(e.to_string()))
        }
    }
}

/// Encodes an RGB buffer (`[h, w, 3]`) as an 8-bit PNG at `out`.
fn write_png(out: &Path, (w, h): (u32, u32), rgb: &[u8]) -> Result<(), png::EncodingError> {
    let file = std::io::BufWriter::new(std::fs::File::create(out)?);
    let mut enc = png::Encoder::new(file, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()
}

/// Cell shade: white at 0, dark blue at the layer's maximum.
fn shade(share: f64) -> RGBColor {
    let s = share.clamp(0.0, 1.0);
    let mix = |hi: f64, lo: f64| (hi + (lo - hi) * s).round() as u8;
    RGBColor(mix(255.0, 8.0), mix(255.0, 48.0), mix(255.0, 107.0))
}

/// Cells of the heatmap, in pixels.
fn heatmap_cell(cols: usize) -> u32 {
    (900 / cols.max(1)).clamp(4, 24) as u32
}

impl Picture for RouterHist {
    fn size(&self) -> (u32, u32) {
        let (rows, cols) = (self.layers.len(), self.num_experts);
        let cell = heatmap_cell(cols);
        // Wide enough for the caption however few the experts.
        (
            (140 + cell * cols as u32).max(400),
            110 + cell * rows as u32,
        )
    }

    /// One rectangle per (layer, expert).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let (rows, cols) = (self.layers.len(), self.num_experts);
        root.fill(&WHITE).map_err(text)?;
        let mut chart = ChartBuilder::on(root)
            .caption("router selections per layer and expert", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0..cols, 0..rows)
            .map_err(text)?;
        let labels: Vec<usize> = self.layers.iter().map(|(l, _)| *l).collect();
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("expert")
            .y_desc("layer")
            .x_labels(cols.min(16))
            .y_labels(rows.min(24))
            .y_label_formatter(&|r| labels.get(*r).map_or(String::new(), |l| l.to_string()))
            .draw()
            .map_err(text)?;
        let cells = self.layers.iter().enumerate().flat_map(|(r, (_, counts))| {
            let max = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
            counts.iter().enumerate().map(move |(c, &n)| {
                Rectangle::new([(c, r), (c + 1, r + 1)], shade(n as f64 / max).filled())
            })
        });
        chart.draw_series(cells).map_err(text)?;
        Ok(())
    }
}

/// Draws `h` as a heatmap at `out`.
pub fn heatmap(h: &RouterHist, out: &Path, format: Format) -> Result<(), PlotError> {
    write_picture(h, out, format)
}

/// Hit rate (%) and decode tok/s against slot count, two panels side by
/// side, a marker per configuration.
struct Sweep<'a>(&'a [SweepPoint]);

impl Picture for Sweep<'_> {
    fn size(&self) -> (u32, u32) {
        (960, 400)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let points = self.0;
        root.fill(&WHITE).map_err(text)?;
        let panels = root.split_evenly((1, 2));
        let max_slots = points.iter().map(|p| p.slots).max().unwrap_or(1).max(1);
        fn hit_pct(p: &SweepPoint) -> f64 {
            100.0 * p.hit_rate
        }
        fn tps(p: &SweepPoint) -> f64 {
            p.decode_tps
        }
        type Panel = (&'static str, &'static str, fn(&SweepPoint) -> f64);
        let series: [Panel; 2] = [
            ("expert cache hit rate", "hit rate %", hit_pct),
            ("decode speed", "tok/s", tps),
        ];
        for (area, (title, unit, y)) in panels.iter().zip(series) {
            let top = points.iter().map(y).fold(0.0f64, f64::max);
            let top = if top > 0.0 { top * 1.1 } else { 1.0 };
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 16))
                .margin(12)
                .x_label_area_size(35)
                .y_label_area_size(50)
                .build_cartesian_2d(0u64..max_slots + 1, 0.0..top)
                .map_err(text)?;
            chart
                .configure_mesh()
                .x_desc("expert slots per layer")
                .y_desc(unit)
                .draw()
                .map_err(text)?;
            let xy: Vec<(u64, f64)> = points.iter().map(|p| (p.slots, y(p))).collect();
            chart
                .draw_series(LineSeries::new(xy.clone(), BLUE.stroke_width(2)))
                .map_err(text)?;
            chart
                .draw_series(xy.into_iter().map(|c| Circle::new(c, 4, BLUE.filled())))
                .map_err(text)?;
        }
        Ok(())
    }
}

/// Draws the sweep chart of `points` at `out`.
pub fn sweep_chart(points: &[SweepPoint], out: &Path, format: Format) -> Result<(), PlotError> {
    write_picture(&Sweep(points), out, format)
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.what {
        What::RouterHist { input, out } => {
            let format = Format::choose(a.format, &out)?;
            let h = RouterHist::parse(&input, &read(&input)?)?;
            heatmap(&h, &out, format).context("plot router-hist")?;
            eprintln!(
                "{}: {} layers × {} experts",
                out.display(),
                h.layers.len(),
                h.num_experts
            );
        }
        What::Sweep { input, out } => {
            let format = Format::choose(a.format, &out)?;
            let points = parse_sweep(&input, &read(&input)?)?;
            sweep_chart(&points, &out, format).context("plot sweep")?;
            eprintln!("{}: {} slot counts", out.display(), points.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ts-plot-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Filled rectangles drawn in the plot area (the background and the
    /// chart frame are not filled with a shade of blue).
    fn count(svg: &str, tag: &str) -> usize {
        svg.matches(tag).count()
    }

    #[test]
    fn heatmap_has_a_cell_per_layer_and_expert() {
        let json = r#"{"num_experts": 4, "top_k": 2, "total": 12,
            "layers": [{"layer": 0, "total": 6, "counts": [3, 0, 2, 1]},
                       {"layer": 2, "total": 6, "counts": [0, 0, 6, 0]}]}"#;
        let h = RouterHist::parse(Path::new("h.json"), json).unwrap();
        assert_eq!(h.layers[1], (2, vec![0, 0, 6, 0]));
        let out = tmp("heat").join("h.svg");
        heatmap(&h, &out, Format::Svg).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Background + 8 cells, every element closed.
        assert_eq!(count(&svg, "<rect"), 1 + 8, "{svg}");
        // The darkest shade once per layer (its most chosen expert), white
        // for never-chosen experts (4 of them) besides the background.
        assert_eq!(count(&svg, r##"fill="#08306B""##), 2, "{svg}");
        assert_eq!(count(&svg, r##"fill="#FFFFFF""##), 1 + 4, "{svg}");
        assert!(svg.contains("\nexpert\n") && svg.contains("\nlayer\n"));
    }

    #[test]
    fn sweep_has_a_point_per_slot_count() {
        let lines = [
            r#"{"test":"sweep","experts":"resident","slots":null,"hit_rate":1.0,"decode_tok_per_s":50.0}"#,
            r#"{"test":"sweep","experts":"streamed","slots":8,"hit_rate":0.5,"decode_tok_per_s":20.0}"#,
            r#"{"test":"sweep","experts":"streamed","slots":4,"hit_rate":0.25,"decode_tok_per_s":10.0}"#,
            r#"{"test":"sweep","experts":"streamed","slots":32,"hit_rate":1.0,"decode_tok_per_s":45.0}"#,
            r#"{"test":"tg128","tok_per_s":3.0}"#,
        ]
        .join("\n");
        let p = parse_sweep(Path::new("s.jsonl"), &lines).unwrap();
        assert_eq!(p.iter().map(|p| p.slots).collect::<Vec<_>>(), [4, 8, 32]);
        let out = tmp("sweep").join("s.svg");
        sweep_chart(&p, &out, Format::Svg).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        // Three markers in each of the two panels, one line per panel.
        assert_eq!(count(&svg, "<circle"), 6, "{svg}");
        assert_eq!(
            count(
                &svg,
                r##"<polyline fill="none" opacity="1" stroke="#0000FF""##
            ),
            2,
            "{svg}"
        );
        assert!(svg.contains("\ndecode speed\n") && svg.contains("\nexpert cache hit rate\n"));
    }

    /// The pixels of a PNG file: `(width, height, rgb)`.
    fn decode_png(path: &Path) -> (u32, u32, Vec<u8>) {
        let bytes = std::fs::read(path).unwrap();
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(
            (info.color_type, info.bit_depth),
            (png::ColorType::Rgb, png::BitDepth::Eight)
        );
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    fn pixel(rgb: &[u8], width: u32, x: u32, y: u32) -> [u8; 3] {
        let i = (y * width + x) as usize * 3;
        [rgb[i], rgb[i + 1], rgb[i + 2]]
    }

    /// `(x, y, width, height)` of the SVG's rectangles filled with `fill`.
    fn svg_rects(svg: &str, fill: &str) -> Vec<[f64; 4]> {
        let attr = |el: &str, name: &str| -> f64 {
            let start = el.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            el[start..].split('"').next().unwrap().parse().unwrap()
        };
        svg.split("<rect")
            .skip(1)
            .filter(|el| el.contains(&format!("fill=\"{fill}\"")))
            .map(|el| ["x", "y", "width", "height"].map(|n| attr(el, n)))
            .collect()
    }

    #[test]
    fn format_comes_from_the_flag_or_the_extension() {
        let f = |flag, out: &str| Format::choose(flag, Path::new(out));
        assert_eq!(f(None, "a/h.svg").unwrap(), Format::Svg);
        assert_eq!(f(None, "h.PNG").unwrap(), Format::Png);
        assert_eq!(f(Some(Format::Png), "h.svg").unwrap(), Format::Png);
        assert_eq!(f(Some(Format::Svg), "h").unwrap(), Format::Svg);
        for bad in ["h.jpg", "h", "h.svg.gz"] {
            assert!(
                matches!(f(None, bad), Err(PlotError::Format { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn png_heatmap_shades_each_cell_and_sets_its_text() {
        let json = r#"{"num_experts": 4, "layers": [
            {"layer": 0, "counts": [3, 0, 2, 1]}, {"layer": 2, "counts": [0, 0, 6, 0]}]}"#;
        let h = RouterHist::parse(Path::new("h.json"), json).unwrap();
        let dir = tmp("heat-png");
        let (svg_path, png_path) = (dir.join("h.svg"), dir.join("h.png"));
        heatmap(&h, &svg_path, Format::Svg).unwrap();
        heatmap(&h, &png_path, Format::Png).unwrap();
        let (w, ht, rgb) = decode_png(&png_path);
        assert_eq!((w, ht), h.size());
        // Shades by hand: 255 + (dark − 255) · share, dark = (8, 48, 107).
        let shade_of =
            |share: f64| [8.0, 48.0, 107.0].map(|d| (255.0 + (d - 255.0) * share).round() as u8);
        assert_eq!(shade_of(2.0 / 3.0), [90, 117, 156]);
        let want = [
            // Layer 0 (bottom row): shares 1, 0, 2/3, 1/3; layer 2: 0, 0, 1, 0.
            [1.0, 0.0, 2.0 / 3.0, 1.0 / 3.0],
            [0.0, 0.0, 1.0, 0.0],
        ];
        // Cell places from the SVG of the same picture: the non-white
        // cells, then every cell on their grid.
        let svg = std::fs::read_to_string(&svg_path).unwrap();
        let dark = svg_rects(&svg, "#08306B");
        assert_eq!(dark.len(), 2);
        let [x0, y_low, cw, ch] = dark[0];
        let y_high = dark[1][1];
        assert!(y_high < y_low, "layer 2 is drawn above layer 0");
        for (shares, y) in want.iter().zip([y_low, y_high]) {
            for (col, &share) in shares.iter().enumerate() {
                let cx = (x0 + cw * (col as f64 + 0.5)) as u32;
                let cy = (y + ch / 2.0) as u32;
                assert_eq!(
                    pixel(&rgb, w, cx, cy),
                    shade_of(share),
                    "row at y {y}, expert {col}"
                );
            }
        }
        // The caption is set in the built-in font: dark pixels in the top
        // strip, anti-aliased (more than one grey level).
        let strip = &rgb[..(w * 30 * 3) as usize];
        let inked: Vec<&[u8]> = strip.chunks_exact(3).filter(|p| p[0] < 128).collect();
        assert!(inked.len() > 200, "{} dark caption pixels", inked.len());
        let greys: std::collections::BTreeSet<u8> = strip.chunks_exact(3).map(|p| p[0]).collect();
        assert!(greys.len() > 8, "{greys:?}");
    }

    #[test]
    fn png_sweep_has_markers_in_both_panels() {
        let lines = [
            r#"{"test":"sweep","slots":4,"hit_rate":0.25,"decode_tok_per_s":10.0}"#,
            r#"{"test":"sweep","slots":8,"hit_rate":0.5,"decode_tok_per_s":20.0}"#,
        ]
        .join("\n");
        let p = parse_sweep(Path::new("s.jsonl"), &lines).unwrap();
        let out = tmp("sweep-png").join("s.png");
        sweep_chart(&p, &out, Format::Png).unwrap();
        let (w, h, rgb) = decode_png(&out);
        assert_eq!((w, h), (960, 400));
        let blue = |x0: u32, x1: u32| {
            (0..h)
                .flat_map(|y| (x0..x1).map(move |x| (x, y)))
                .filter(|&(x, y)| pixel(&rgb, w, x, y) == [0, 0, 255])
                .count()
        };
        // Two filled markers (radius 4) and a line in each panel.
        assert!(blue(0, w / 2) > 2 * 40, "{}", blue(0, w / 2));
        assert!(blue(w / 2, w) > 2 * 40, "{}", blue(w / 2, w));
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let p = Path::new("x.json");
        assert!(matches!(
            RouterHist::parse(p, "{not json"),
            Err(PlotError::Json { line: 1, .. })
        ));
        assert!(matches!(
            RouterHist::parse(p, r#"{"num_experts": 2, "layers": [{"layer": 0, "counts": [1]}]}"#),
            Err(PlotError::Field { ref field, .. }) if field == "layers[0].counts"
        ));
        assert!(matches!(
            RouterHist::parse(p, r#"{"layers": []}"#),
            Err(PlotError::Field { ref field, .. }) if field == "num_experts"
        ));
        assert!(matches!(
            RouterHist::parse(p, r#"{"num_experts": 2, "layers": []}"#),
            Err(PlotError::Empty { .. })
        ));
        assert!(matches!(
            parse_sweep(p, "{\"test\":\"sweep\",\"slots\":4}\n{oops"),
            Err(PlotError::Field { .. })
        ));
        assert!(matches!(
            parse_sweep(p, "{\"test\":\"sweep\"}\n{oops"),
            Err(PlotError::Json { line: 2, .. })
        ));
        assert!(matches!(
            parse_sweep(p, r#"{"test":"tg128","tok_per_s":3.0}"#),
            Err(PlotError::Empty { .. })
        ));
        assert!(matches!(
            read(Path::new("/nonexistent/x.json")),
            Err(PlotError::Read { .. })
        ));
    }
}
