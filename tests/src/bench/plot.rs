//! Pictures of a sweep: latency and bandwidth against message size, one
//! picture each, as SVG (and PNG beside it), drawn with plotters.
//!
//! The x axis is log2 of the message size (a tick per power of two, every
//! other one labelled, 2 B to 8 MiB); latency has a log y axis, bandwidth a
//! linear one. Text is laid out with DejaVu Sans, read at run time (Debian's
//! fonts-dejavu-core, or the file XIW_BENCH_FONT names): the SVG names the
//! family "DejaVu Sans, sans-serif" and leaves the glyphs to the viewer, the
//! PNG has them drawn in.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::register_font;

use super::sweep::{size_label, Kind, Series, Sweep};

pub(crate) const FAMILY: &str = "DejaVu Sans, sans-serif";
const SIZE: (u32, u32) = (1000, 640);

/// Where DejaVu Sans is on Debian and Fedora.
const FONT_FILES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers the font once; the error says what to install.
pub(crate) fn font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let wanted: Vec<PathBuf> = match std::env::var_os("XIW_BENCH_FONT") {
            Some(f) => vec![PathBuf::from(f)],
            None => FONT_FILES.iter().map(PathBuf::from).collect(),
        };
        let Some((path, bytes)) = wanted
            .iter()
            .find_map(|p| std::fs::read(p).ok().map(|b| (p, b)))
        else {
            return Err(format!(
                "no font to draw with: install fonts-dejavu-core (looked for {})",
                wanted
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        // plotters keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        register_font(FAMILY, FontStyle::Normal, bytes)
            .map_err(|_| format!("{}: not a font plotters can read", path.display()))
    })
    .clone()
}

/// The colour of the `i`-th RDMA series, and of the `j`-th TCP one.
fn colour(tcp: bool, i: usize) -> RGBColor {
    const RDMA: [RGBColor; 6] = [
        RGBColor(0x1f, 0x5f, 0xbf),
        RGBColor(0xe0, 0x6c, 0x00),
        RGBColor(0x1a, 0x9a, 0x3a),
        RGBColor(0xc0, 0x20, 0x30),
        RGBColor(0x80, 0x50, 0xb0),
        RGBColor(0x8c, 0x56, 0x4b),
    ];
    const TCP: [RGBColor; 3] = [
        RGBColor(0x20, 0x20, 0x20),
        RGBColor(0x80, 0x80, 0x80),
        RGBColor(0x50, 0x50, 0x50),
    ];
    if tcp {
        TCP[i % TCP.len()]
    } else {
        RDMA[i % RDMA.len()]
    }
}

fn is_tcp(s: &Series) -> bool {
    s.name.starts_with("TCP")
}

/// A number for a log axis: as few digits as it needs.
pub(crate) fn tick(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        let s = format!("{v:.1}");
        s.trim_end_matches(".0").to_string()
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The x of a size: log2 of it.
fn x_of(bytes: u64) -> f64 {
    (bytes.max(1) as f64).log2()
}

fn draw_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    sweep: &Sweep,
    kind: Kind,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let series = sweep.of_kind(kind);
    if series.is_empty() {
        return Err(format!("no {kind:?} series to draw").to_lowercase());
    }
    root.fill(&WHITE).map_err(e)?;
    let (chart_area, foot) = root.split_vertically(SIZE.1 - 26);

    let all: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.value))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = all.iter().copied().fold(0.0, f64::max);
    let sizes: Vec<u64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.bytes))
        .collect();
    let kmin = sizes.iter().map(|&b| x_of(b)).fold(f64::INFINITY, f64::min);
    let kmax = sizes.iter().map(|&b| x_of(b)).fold(0.0, f64::max);
    let first = kmin.round() as i32;
    // One key point per power of two: plotters steps by 1 when asked for as
    // many labels as there are powers.
    let n_keys = (kmax.round() - kmin.round()) as usize + 2;
    let x_range = kmin - 0.5..kmax + 0.5;
    let x_fmt = |x: &f64| {
        let k = x.round() as i32;
        if (x - x.round()).abs() < 1e-6 && (k - first) % 2 == 0 && (0..63).contains(&k) {
            size_label(1u64 << k)
        } else {
            String::new()
        }
    };
    let (what, y_desc) = match kind {
        Kind::Latency => ("latency", "latency [µs], log scale (median; see legend)"),
        Kind::Bandwidth => ("bandwidth", "bandwidth [MiB/s] (2^20 bytes per second)"),
    };
    let caption = format!("{}: {what} against message size", sweep.title);
    let mut builder = ChartBuilder::on(&chart_area);
    builder
        .caption(caption, (FAMILY, 22))
        .margin(14)
        .margin_right(28)
        .x_label_area_size(52)
        .y_label_area_size(78);
    let x_desc = "message size [bytes], log2 scale";
    let style = |i: usize, s: &Series| {
        let c = colour(is_tcp(s), i);
        (c, c.stroke_width(if is_tcp(s) { 2 } else { 3 }))
    };
    let mut counts = (0usize, 0usize);
    let mut pick = |s: &Series| {
        let n = if is_tcp(s) {
            &mut counts.1
        } else {
            &mut counts.0
        };
        *n += 1;
        *n - 1
    };
    let picks: Vec<usize> = series.iter().map(|s| pick(s)).collect();
    let pts = |s: &Series| -> Vec<(f64, f64)> {
        s.points
            .iter()
            // perftest under emulation now and then reports a bandwidth of
            // 0 for a run that completed: a failed measurement, not drawn.
            .filter(|p| p.value > 0.0 && p.value.is_finite())
            .map(|p| (x_of(p.bytes), p.value))
            .collect()
    };

    macro_rules! body {
        ($chart:expr, $y_fmt:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .x_labels(n_keys)
                .y_labels(14)
                .x_max_light_lines(1)
                .x_label_formatter(&x_fmt)
                .y_label_formatter(&$y_fmt)
                .label_style((FAMILY, 15))
                .axis_desc_style((FAMILY, 16))
                .light_line_style(RGBColor(0xee, 0xee, 0xee))
                .bold_line_style(RGBColor(0xd8, 0xd8, 0xd8))
                .draw()
                .map_err(e)?;
            for (s, &i) in series.iter().zip(&picks) {
                let (c, st) = style(i, s);
                let tcp = is_tcp(s);
                let points = pts(s);
                if is_tcp(s) {
                    chart
                        .draw_series(DashedLineSeries::new(points.clone(), 9, 5, st))
                        .map_err(e)?;
                } else {
                    chart
                        .draw_series(LineSeries::new(points.clone(), st))
                        .map_err(e)?;
                }
                chart
                    .draw_series(points.iter().map(|&p| {
                        if is_tcp(s) {
                            TriangleMarker::new(p, 4, c.filled()).into_dyn()
                        } else {
                            Circle::new(p, 3, c.filled()).into_dyn()
                        }
                    }))
                    .map_err(e)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        let line = vec![(x, y), (x + 26, y)];
                        if tcp {
                            DashedPathElement::new(line, 7, 4, st).into_dyn()
                        } else {
                            PathElement::new(line, st).into_dyn()
                        }
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .label_font((FAMILY, 15))
                .background_style(WHITE.mix(0.9))
                .border_style(RGBColor(0xa0, 0xa0, 0xa0))
                .margin(12)
                .draw()
                .map_err(e)?;
        }};
    }

    match kind {
        Kind::Latency => {
            let y = (lo / 1.6..hi * 1.6).log_scale();
            let chart = builder.build_cartesian_2d(x_range, y).map_err(e)?;
            body!(chart, |v: &f64| tick(*v));
        }
        Kind::Bandwidth => {
            // Room above the highest point for the legend.
            let y = 0.0..hi * 1.45;
            let chart = builder.build_cartesian_2d(x_range, y).map_err(e)?;
            body!(chart, |v: &f64| format!("{v:.0}"));
        }
    }

    foot.draw(&Text::new(
        facts(sweep),
        (14, 4),
        (FAMILY, 13).into_font().color(&FACTS_COLOUR),
    ))
    .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// A picture drawn alike on every backend: the SVG and the PNG beside it.
pub trait Picture {
    /// Width and height, in pixels.
    const SIZE: (u32, u32);
    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static;
}

/// Draws `pic` to `svg`, and to `png` if given.
pub fn render<P: Picture>(pic: &P, svg: &Path, png: Option<&Path>) -> Result<(), String> {
    font()?;
    let ctx = |p: &Path, e: String| format!("{}: {e}", p.display());
    {
        let root = SVGBackend::new(svg, P::SIZE).into_drawing_area();
        pic.draw_on(root).map_err(|e| ctx(svg, e))?;
    }
    if let Some(png) = png {
        let (w, h) = P::SIZE;
        let mut buf = vec![0u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, P::SIZE).into_drawing_area();
            pic.draw_on(root).map_err(|e| ctx(png, e))?;
        }
        write_png(png, &buf, P::SIZE).map_err(|e| ctx(png, e))?;
    }
    Ok(())
}

/// The line at a picture's foot: the tool, the machine, the build, the date.
pub fn facts(sweep: &Sweep) -> String {
    let m = &sweep.machine;
    format!(
        "{} | {} CPUs ({}), Linux {} | xiw {} | {}",
        sweep.tool,
        m.cpus,
        if m.cpu.is_empty() { "?" } else { &m.cpu },
        m.kernel,
        m.xiw_version,
        m.date
    )
}

/// The colour of [`facts`].
pub const FACTS_COLOUR: RGBColor = RGBColor(0x60, 0x60, 0x60);

struct Lines<'a>(&'a Sweep, Kind);

impl Picture for Lines<'_> {
    const SIZE: (u32, u32) = SIZE;
    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        draw_on(root, self.0, self.1)
    }
}

/// Draws the `kind` picture of `sweep` to `svg`, and to `png` if given.
pub fn draw(sweep: &Sweep, kind: Kind, svg: &Path, png: Option<&Path>) -> Result<(), String> {
    render(&Lines(sweep, kind), svg, png)
}

pub(crate) fn write_png(path: &Path, rgb: &[u8], (w, h): (u32, u32)) -> Result<(), String> {
    let f = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().map_err(|e| e.to_string())?;
    wr.write_image_data(rgb).map_err(|e| e.to_string())?;
    wr.finish().map_err(|e| e.to_string())
}

/// Draws PREFIX-latency.svg and PREFIX-bandwidth.svg (and .png beside each)
/// in `dir`; returns the files written.
pub fn draw_all(sweep: &Sweep, dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    for (kind, name) in [(Kind::Latency, "latency"), (Kind::Bandwidth, "bandwidth")] {
        if sweep.of_kind(kind).is_empty() {
            continue;
        }
        let svg = dir.join(format!("{prefix}-{name}.svg"));
        let png = dir.join(format!("{prefix}-{name}.png"));
        draw(sweep, kind, &svg, Some(&png))?;
        written.push(svg);
        written.push(png);
    }
    if written.is_empty() {
        return Err("the sweep has no points to draw".into());
    }
    Ok(written)
}
