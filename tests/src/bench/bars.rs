//! Pictures of a one-boot run (tests/vm/bench.sh --out): grouped bars, one
//! group per test and message size, one bar per device that ran it, latency
//! (log scale) and bandwidth (linear) as two pictures, SVG and PNG beside
//! each. A run that gave no number is a cross where its bar would be; a
//! device that cannot run a test has no place in its group.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::plot::{facts, render, tick, Picture, FACTS_COLOUR, FAMILY};
use super::sweep::{device_label, size_label, test_short, Kind, Series, Sweep};

const SIZE: (u32, u32) = (1300, 680);
/// The legend's column, right of the bars.
const LEGEND_WIDTH: u32 = 230;

/// The devices in the order their bars stand in every group (and their
/// colours); any other after them, as they first appear.
const DEVICES: &[&str] = &[
    "xiw-kernel",
    "xiw-kernel-crc",
    "xiw-standalone",
    "siw",
    "rxe",
    "tcp",
];

const COLOURS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x5f, 0xbf),
    RGBColor(0x7f, 0xa8, 0xe8),
    RGBColor(0x1a, 0x9a, 0x3a),
    RGBColor(0xe0, 0x6c, 0x00),
    RGBColor(0xc0, 0x20, 0x30),
    RGBColor(0x60, 0x60, 0x60),
];
const OTHER_COLOURS: [RGBColor; 3] = [
    RGBColor(0x80, 0x50, 0xb0),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0x20, 0x90, 0x90),
];

/// One bar: a device's value, or None where its run gave no number.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub device: String,
    pub value: Option<f64>,
}

/// The bars of one test at one size.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub test: String,
    pub bytes: u64,
    pub bars: Vec<Bar>,
}

/// The device and the test of a series: its own fields, or (a file written
/// before it had them) its name's two halves.
fn keys(s: &Series) -> (String, String) {
    if !s.device.is_empty() {
        return (s.device.clone(), s.test.clone());
    }
    match s.name.split_once(": ") {
        Some((d, t)) => (d.to_string(), t.to_string()),
        None => (s.name.clone(), String::new()),
    }
}

fn rank(devices: &[String], d: &str) -> usize {
    devices.iter().position(|x| x == d).unwrap_or(usize::MAX)
}

/// Every device of the run, in bar order.
pub fn devices(sweep: &Sweep) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for s in &sweep.series {
        let d = keys(s).0;
        if !seen.contains(&d) {
            seen.push(d);
        }
    }
    let known = |d: &String| DEVICES.iter().position(|k| k == d);
    let mut out: Vec<String> = DEVICES
        .iter()
        .map(|d| d.to_string())
        .filter(|d| seen.contains(d))
        .collect();
    out.extend(seen.iter().filter(|d| known(d).is_none()).cloned());
    out
}

fn colour(devices: &[String], d: &str) -> RGBColor {
    match DEVICES.iter().position(|k| *k == d) {
        Some(i) => COLOURS[i],
        None => {
            let others = devices.iter().filter(|x| !DEVICES.contains(&x.as_str()));
            let i = others.take_while(|x| x.as_str() != d).count();
            OTHER_COLOURS[i % OTHER_COLOURS.len()]
        }
    }
}

/// The groups of one kind: tests in the order they first appear, the TCP
/// floor's last; in each, the bars in device order. A value of 0 or less
/// (perftest's now and then, for a run that completed) is no number.
pub fn groups(sweep: &Sweep, kind: Kind) -> Vec<Group> {
    let devices = devices(sweep);
    let mut out: Vec<Group> = Vec::new();
    let mut add = |test: &str, bytes: u64, bar: Bar| match out
        .iter_mut()
        .find(|g| g.test == test && g.bytes == bytes)
    {
        Some(g) => g.bars.push(bar),
        None => out.push(Group {
            test: test.to_string(),
            bytes,
            bars: vec![bar],
        }),
    };
    for s in sweep.series.iter().filter(|s| s.kind == kind) {
        let (device, test) = keys(s);
        for p in &s.points {
            let value = Some(p.value).filter(|v| *v > 0.0 && v.is_finite());
            add(
                &test,
                p.bytes,
                Bar {
                    device: device.clone(),
                    value,
                },
            );
        }
        for &bytes in &s.failed {
            add(
                &test,
                bytes,
                Bar {
                    device: device.clone(),
                    value: None,
                },
            );
        }
    }
    let tcp_only = |g: &Group| g.bars.iter().all(|b| b.device == "tcp");
    let (mut rdma, tcp): (Vec<Group>, Vec<Group>) = out.into_iter().partition(|g| !tcp_only(g));
    rdma.extend(tcp);
    for g in &mut rdma {
        g.bars.sort_by_key(|b| rank(&devices, &b.device));
    }
    rdma
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
    let groups = groups(sweep, kind);
    if groups.is_empty() {
        return Err(format!("no {kind:?} values to draw").to_lowercase());
    }
    let devices = devices(sweep);
    root.fill(&WHITE).map_err(e)?;
    let (chart_area, foot) = root.split_vertically(SIZE.1 - 26);
    let (plot_area, side) = chart_area.split_horizontally(SIZE.0 - LEGEND_WIDTH);

    let values: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.bars.iter().filter_map(|b| b.value))
        .collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0, f64::max);
    let (lo, hi) = if values.is_empty() {
        (1.0, 10.0)
    } else {
        (lo, hi)
    };
    let n = groups.len() as f64;
    let slots = groups.iter().map(|g| g.bars.len()).max().unwrap_or(1);
    let width = 0.8 / slots as f64;

    let (what, y_desc) = match kind {
        Kind::Latency => (
            "latency",
            "latency [µs], log scale (one way; ib_read_lat a round trip)",
        ),
        Kind::Bandwidth => ("bandwidth", "bandwidth [MiB/s] (2^20 bytes per second)"),
    };
    let mut builder = ChartBuilder::on(&plot_area);
    builder
        .caption(format!("{}: {what}", sweep.title), (FAMILY, 22))
        .margin(14)
        .x_label_area_size(80)
        .y_label_area_size(78);

    // Text that goes on the whole picture once the chart is drawn, at
    // pixels of it: the group labels below the bars (outside the chart's
    // plotting area) and the crosses of failed runs.
    let mut labels: Vec<((i32, i32), String, RGBColor)> = Vec::new();
    macro_rules! body {
        ($chart:expr, $y_min:expr, $y_top:expr, $y_fmt:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .disable_x_axis()
                .y_desc(y_desc)
                .y_labels(12)
                .y_label_formatter(&$y_fmt)
                .label_style((FAMILY, 15))
                .axis_desc_style((FAMILY, 16))
                .light_line_style(RGBColor(0xee, 0xee, 0xee))
                .bold_line_style(RGBColor(0xd8, 0xd8, 0xd8))
                .draw()
                .map_err(e)?;
            let y_min: f64 = $y_min;
            let y_top: f64 = $y_top;
            let grey = RGBColor(0xa0, 0xa0, 0xa0);
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, y_min), (n, y_min)],
                    grey.stroke_width(1),
                )))
                .map_err(e)?;
            chart
                .draw_series((1..groups.len()).map(|g| {
                    PathElement::new(
                        vec![(g as f64, y_min), (g as f64, y_top)],
                        RGBColor(0xe4, 0xe4, 0xe4).stroke_width(1),
                    )
                }))
                .map_err(e)?;
            for (i, g) in groups.iter().enumerate() {
                let left = i as f64 + 0.5 - width * g.bars.len() as f64 / 2.0;
                for (j, b) in g.bars.iter().enumerate() {
                    let x0 = left + j as f64 * width;
                    let c = colour(&devices, &b.device);
                    match b.value {
                        Some(v) => {
                            chart
                                .draw_series(std::iter::once(Rectangle::new(
                                    [(x0 + width * 0.08, y_min), (x0 + width * 0.92, v)],
                                    c.filled(),
                                )))
                                .map_err(e)?;
                        }
                        None => {
                            let (px, py) = chart.backend_coord(&(x0 + width / 2.0, y_min));
                            labels.push(((px, py - 10), "×".into(), c));
                        }
                    }
                }
                let (px, py) = chart.backend_coord(&(i as f64 + 0.5, y_min));
                let mut lines = test_short(&g.test);
                lines.push(size_label(g.bytes));
                for (k, l) in lines.into_iter().enumerate() {
                    labels.push(((px, py + 8 + 16 * k as i32), l, RGBColor(0x20, 0x20, 0x20)));
                }
            }
        }};
    }
    match kind {
        Kind::Latency => {
            let (y_min, y_top) = (lo / 2.0, hi * 2.0);
            let chart = builder
                .build_cartesian_2d(0.0..n, (y_min..y_top).log_scale())
                .map_err(e)?;
            body!(chart, y_min, y_top, |v: &f64| tick(*v));
        }
        Kind::Bandwidth => {
            let y_top = hi * 1.1;
            let chart = builder.build_cartesian_2d(0.0..n, 0.0..y_top).map_err(e)?;
            body!(chart, 0.0, y_top, |v: &f64| format!("{v:.0}"));
        }
    }
    for ((x, y), text, c) in labels {
        let size = if text == "×" { 20 } else { 13 };
        let style = (FAMILY, size)
            .into_font()
            .color(&c)
            .pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(text, (x, y), style)).map_err(e)?;
    }

    // The legend: the devices of this picture, and the cross.
    let shown: Vec<&String> = devices
        .iter()
        .filter(|d| {
            groups
                .iter()
                .any(|g| g.bars.iter().any(|b| &b.device == *d))
        })
        .collect();
    let text = |s: String, y: i32| {
        Text::new(
            s,
            (34, y),
            (FAMILY, 15)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center)),
        )
    };
    let mut y = 70;
    for d in shown {
        let c = colour(&devices, d);
        side.draw(&Rectangle::new([(10, y - 7), (26, y + 7)], c.filled()))
            .map_err(e)?;
        side.draw(&text(device_label(d), y)).map_err(e)?;
        y += 26;
    }
    if groups
        .iter()
        .any(|g| g.bars.iter().any(|b| b.value.is_none()))
    {
        side.draw(&Text::new(
            "×",
            (18, y),
            (FAMILY, 20)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(e)?;
        side.draw(&text("failed: no number".into(), y)).map_err(e)?;
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

struct Bars<'a>(&'a Sweep, Kind);

impl Picture for Bars<'_> {
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
    render(&Bars(sweep, kind), svg, png)
}

/// Draws PREFIX-latency.svg and PREFIX-bandwidth.svg (and .png beside each)
/// in `dir`; returns the files written.
pub fn draw_all(sweep: &Sweep, dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    for (kind, name) in [(Kind::Latency, "latency"), (Kind::Bandwidth, "bandwidth")] {
        if groups(sweep, kind).is_empty() {
            continue;
        }
        let svg = dir.join(format!("{prefix}-{name}.svg"));
        let png = dir.join(format!("{prefix}-{name}.png"));
        draw(sweep, kind, &svg, Some(&png))?;
        written.push(svg);
        written.push(png);
    }
    if written.is_empty() {
        return Err("the run has no values to draw".into());
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Machine;

    const LINES: &str = "\
BENCH tcp lat-spin_2 14.5
BENCH tcp bw_65536 190.5
BENCH xiw-standalone ib_write_lat_2 100.25
BENCH xiw-standalone qperf_rc_lat_2 n/a
BENCH xiw-kernel ib_write_lat_2 92.5
BENCH xiw-kernel qperf_rc_lat_2 880.5
BENCH xiw-kernel ib_write_bw_65536 33.75
BENCH siw ib_write_lat_2 22.5
BENCH siw qperf_rc_lat_2 failed
BENCH siw ib_write_bw_65536 0
BENCH rxe ib_write_bw_65536 67.25
";

    fn run() -> Sweep {
        Sweep::from_bench_lines(LINES, "tests/vm/bench.sh", "one boot", Machine::default())
    }

    fn bars(g: &Group) -> Vec<(&str, Option<f64>)> {
        g.bars
            .iter()
            .map(|b| (b.device.as_str(), b.value))
            .collect()
    }

    #[test]
    fn groups_in_test_order_tcp_last_bars_in_device_order() {
        let s = run();
        assert_eq!(
            devices(&s),
            ["xiw-kernel", "xiw-standalone", "siw", "rxe", "tcp"]
        );
        let lat = groups(&s, Kind::Latency);
        let names: Vec<(&str, u64)> = lat.iter().map(|g| (g.test.as_str(), g.bytes)).collect();
        assert_eq!(
            names,
            [("ib_write_lat", 2), ("qperf_rc_lat", 2), ("lat-spin", 2)]
        );
        assert_eq!(
            bars(&lat[0]),
            [
                ("xiw-kernel", Some(92.5)),
                ("xiw-standalone", Some(100.25)),
                ("siw", Some(22.5))
            ]
        );
        // Standalone cannot run qperf: no place; siw's failed run: a cross.
        assert_eq!(bars(&lat[1]), [("xiw-kernel", Some(880.5)), ("siw", None)]);
        let bw = groups(&s, Kind::Bandwidth);
        assert_eq!(bw.len(), 2);
        assert_eq!(
            bars(&bw[0]),
            [
                ("xiw-kernel", Some(33.75)),
                ("siw", None),
                ("rxe", Some(67.25))
            ]
        );
        assert_eq!(bars(&bw[1]), [("tcp", Some(190.5))]);
    }

    #[test]
    fn draws_both_pictures() {
        let s = run();
        let dir = std::env::temp_dir().join(format!("xiw-bars-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let files = draw_all(&s, &dir, "run").expect("draws");
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "run-latency.svg",
                "run-latency.png",
                "run-bandwidth.svg",
                "run-bandwidth.png"
            ]
        );
        let svg = std::fs::read_to_string(dir.join("run-latency.svg")).expect("svg");
        for text in [
            "ib_write_lat",
            "rc_lat",
            "TCP ping-pong",
            "xiw kernel mode",
            "xiw standalone",
            "failed: no number",
        ] {
            assert!(svg.contains(text), "{text} is not in the picture");
        }
        // Rectangles of a device's colour: its bars and its legend square.
        let rects = |fill: &str| {
            svg.lines()
                .filter(|l| l.starts_with("<rect") && l.contains(&format!("fill=\"{fill}\"")))
                .count()
        };
        // xiw kernel mode: two bars; siw: one, its failed run a cross.
        assert_eq!(rects("#1F5FBF"), 3);
        assert_eq!(rects("#E06C00"), 2);
        let crosses: Vec<&str> = svg.lines().filter(|l| l.trim() == "×").collect();
        // siw's failed run and the legend's cross.
        assert_eq!(crosses.len(), 2);
        let png = std::fs::metadata(dir.join("run-bandwidth.png")).expect("png");
        std::fs::remove_dir_all(&dir).ok();
        assert!(png.len() > 1000);
    }

    #[test]
    fn nothing_to_draw() {
        let s = Sweep::from_bench_lines(
            "BENCH xiw-standalone qperf_rc_lat_2 n/a\n",
            "t",
            "t",
            Machine::default(),
        );
        assert!(groups(&s, Kind::Latency).is_empty());
        let dir = std::env::temp_dir();
        assert!(draw_all(&s, &dir, "never").is_err());
    }
}
