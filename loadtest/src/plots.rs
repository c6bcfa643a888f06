//! PNG plots for the `--compare` report, drawn with plotters into a bitmap. Text goes
//! through ab_glyph with DejaVu Sans embedded from the `dejavu` crate, so nothing on the
//! machine (no fonts, no fontconfig) is needed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// The family every text asks for (plotters' default) and the one registered.
const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (1100, 650);
/// Distinct on white, and told apart by people with the common colour blindness.
const COLORS: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(213, 94, 0),
    RGBColor(86, 180, 233),
];

/// One labelled line of a chart: (x, y) points in order of x.
#[derive(Debug, Clone)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// The running count of `at` against seconds since `start`, as the corners of a step
/// line: from (0, 0), up by the number of instants at each distinct time. Instants
/// before `start` count at 0.
pub fn cumulative(start: Instant, at: impl IntoIterator<Item = Instant>) -> Vec<(f64, f64)> {
    let mut since: Vec<Duration> = at
        .into_iter()
        .map(|t| t.saturating_duration_since(start))
        .collect();
    since.sort();
    let mut points = vec![(0.0, 0.0)];
    let mut count = 0usize;
    let mut i = 0;
    while i < since.len() {
        let t = since[i];
        let same = since[i..].iter().take_while(|s| **s == t).count();
        let x = t.as_secs_f64();
        points.push((x, count as f64));
        count += same;
        points.push((x, count as f64));
        i += same;
    }
    points
}

/// Where a legend may go, and the share of the plotting area it roughly covers (x from
/// the left, y from the bottom, 0 to 1).
struct Spot {
    at: SeriesLabelPosition,
    x: (f64, f64),
    y: (f64, f64),
}

/// In order of preference.
const LEGEND_SPOTS: [Spot; 6] = [
    Spot {
        at: SeriesLabelPosition::LowerRight,
        x: (0.6, 1.0),
        y: (0.0, 0.3),
    },
    Spot {
        at: SeriesLabelPosition::UpperLeft,
        x: (0.0, 0.4),
        y: (0.7, 1.0),
    },
    Spot {
        at: SeriesLabelPosition::MiddleRight,
        x: (0.6, 1.0),
        y: (0.35, 0.65),
    },
    Spot {
        at: SeriesLabelPosition::UpperRight,
        x: (0.6, 1.0),
        y: (0.7, 1.0),
    },
    Spot {
        at: SeriesLabelPosition::MiddleLeft,
        x: (0.0, 0.4),
        y: (0.35, 0.65),
    },
    Spot {
        at: SeriesLabelPosition::LowerLeft,
        x: (0.0, 0.4),
        y: (0.0, 0.3),
    },
];

/// The spot of [`LEGEND_SPOTS`] that the lines cross least (the first such), for a chart from (0, 0) to (`x_max`, `y_max`). Each segment counts as 16 points
/// along it, so a line that crosses a spot between two samples still counts there.
fn legend_spot(lines: &[Line], x_max: f64, y_max: f64) -> SeriesLabelPosition {
    let mut hits = [0usize; LEGEND_SPOTS.len()];
    for line in lines {
        for pair in line.points.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            for k in 0..=16 {
                let f = f64::from(k) / 16.0;
                let (x, y) = ((x0 + (x1 - x0) * f) / x_max, (y0 + (y1 - y0) * f) / y_max);
                for (hit, spot) in hits.iter_mut().zip(&LEGEND_SPOTS) {
                    if (spot.x.0..=spot.x.1).contains(&x) && (spot.y.0..=spot.y.1).contains(&y) {
                        *hit += 1;
                    }
                }
            }
        }
    }
    let best = (0..hits.len()).min_by_key(|&i| hits[i]).unwrap_or(0);
    LEGEND_SPOTS[best].at.clone()
}

/// An axis label: no trailing zeros (`300`, `2.5`, not `300.0`, `2.50`).
fn tick(v: &f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

/// `converged GpuJobs over time`: one line per contender.
pub fn converged(path: &Path, lines: &[Line]) -> anyhow::Result<()> {
    draw(path, |root| {
        panel(
            root,
            "converged GpuJobs over time",
            "GpuJobs converged",
            x_max(lines),
            lines,
        )
    })
}

/// Two panels over the same seconds: each replica's resident memory (MiB) above, its
/// work-queue depth below.
pub fn operator(path: &Path, title: &str, rss_mib: &[Line], depth: &[Line]) -> anyhow::Result<()> {
    draw(path, |root| {
        let root = root
            .titled(title, (FONT, 26))
            .map_err(|e| anyhow!("drawing the title: {e}"))?;
        let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
        let x = x_max(rss_mib).max(x_max(depth));
        panel(&top, "resident memory (VmRSS)", "MiB", x, rss_mib)?;
        panel(
            &bottom,
            "work-queue depth (workqueue_depth)",
            "GpuJobs queued",
            x,
            depth,
        )
    })
}

/// A white PNG of [`SIZE`] at `path`, drawn by `f`.
fn draw(
    path: &Path,
    f: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    // Registering again replaces the same font: harmless.
    plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow!("the embedded DejaVu Sans is not a font ab_glyph reads"))?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    let result = root
        .fill(&WHITE)
        .map_err(|e| anyhow!("{e}"))
        .and_then(|()| f(&root))
        .and_then(|()| root.present().map_err(|e| anyhow!("{e}")));
    result.with_context(|| format!("drawing {}", path.display()))
}

/// One chart on `area`: x in seconds since the first create, from 0 to `x_max`.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    caption: &str,
    y_desc: &str,
    x_max: f64,
    lines: &[Line],
) -> anyhow::Result<()> {
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    // Headroom above the highest point; an all-zero line still gets an axis.
    let y_max = (y_max * 1.08).max(1.0);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| anyhow!("{caption}: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the phase's first create")
        .y_desc(y_desc)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 17))
        .light_line_style(WHITE)
        .draw()
        .map_err(|e| anyhow!("{caption}: the axes: {e}"))?;
    for (line, color) in lines.iter().zip(COLORS.iter().cycle()) {
        let style = color.stroke_width(3);
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), style))
            .map_err(|e| anyhow!("{caption}: {}: {e}", line.label))?
            .label(&line.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], style));
    }
    chart
        .configure_series_labels()
        .position(legend_spot(lines, x_max, y_max))
        .label_font((FONT, 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{caption}: the legend: {e}"))?;
    Ok(())
}

/// The last x of any line, at least 1 (an axis needs a width).
fn x_max(lines: &[Line]) -> f64 {
    lines
        .iter()
        .filter_map(|l| l.points.last().map(|p| p.0))
        .fold(1.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_steps_up_at_each_distinct_time() {
        let start = Instant::now();
        let s = |secs: u64| start + Duration::from_secs(secs);
        let points = cumulative(start, [s(3), s(1), s(1)]);
        assert_eq!(
            points,
            vec![(0.0, 0.0), (1.0, 0.0), (1.0, 2.0), (3.0, 2.0), (3.0, 3.0)]
        );
        assert_eq!(cumulative(start, []), vec![(0.0, 0.0)]);
    }

    #[test]
    fn the_legend_goes_where_the_lines_are_not() {
        let line = |points: &[(f64, f64)]| Line {
            label: String::new(),
            points: points.to_vec(),
        };
        let spot = |lines: &[Line]| legend_spot(lines, 10.0, 10.0);
        // Rising from the lower left to the upper right: the lower right is free.
        let rising = line(&[(0.0, 0.0), (10.0, 10.0)]);
        assert!(matches!(spot(&[rising]), SeriesLabelPosition::LowerRight));
        // Along the top and along the bottom (a busy queue beside an idle one): the
        // middle, on the right.
        let top = line(&[(0.0, 0.0), (1.0, 9.5), (10.0, 9.5)]);
        let bottom = line(&[(0.0, 0.0), (10.0, 0.0)]);
        assert!(matches!(
            spot(&[top, bottom]),
            SeriesLabelPosition::MiddleRight
        ));
        // Nothing drawn: the first choice.
        assert!(matches!(spot(&[]), SeriesLabelPosition::LowerRight));
    }

    #[test]
    fn ticks_have_no_trailing_zeros() {
        assert_eq!(tick(&300.0), "300");
        assert_eq!(tick(&2.5), "2.5");
        assert_eq!(tick(&0.126), "0.13");
        assert_eq!(tick(&-0.0), "0");
    }

    #[test]
    fn draws_a_png() {
        let path = std::env::temp_dir().join(format!("plots-test-{}.png", std::process::id()));
        let line = |label: &str, k: f64| Line {
            label: label.to_owned(),
            points: (0..10).map(|i| (f64::from(i), k * f64::from(i))).collect(),
        };
        converged(&path, &[line("a", 1.0), line("b", 2.0)]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
    }
}
