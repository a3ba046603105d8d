//! PNG line and scatter plots for reports, with an embedded font so no system fonts are needed.

use std::ops::Range;
use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

static FONT: Once = Once::new();

/// Ten colours that stay distinct on white (the "tab10" palette of matplotlib's defaults).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn register_font() {
    FONT.call_once(|| {
        // DejaVu Sans is compiled into the binary (the `dejavu` crate); plotters' ab_glyph
        // backend needs every family it is asked for registered up front.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A polyline through the points.
    Line,
    /// A dashed-looking thin line (drawn thinner, for references such as theory curves).
    Reference,
    /// Circles at the points.
    Points,
}

/// One named series.
pub struct Series {
    /// The legend label.
    pub label: String,
    /// (x, y) points; non-finite points (and non-positive ones on log axes) are skipped.
    pub points: Vec<(f64, f64)>,
    /// How to draw it.
    pub mark: Mark,
    /// Its colour's index in the palette.
    pub color: usize,
}

/// A line/scatter plot with optional log axes, rendered to PNG.
pub struct LinePlot {
    title: String,
    x_label: String,
    y_label: String,
    log_x: bool,
    log_y: bool,
    series: Vec<Series>,
}

impl LinePlot {
    /// A plot with a title and axis labels.
    pub fn new(title: &str, x_label: &str, y_label: &str) -> Self {
        Self {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_x: false,
            log_y: false,
            series: Vec::new(),
        }
    }

    /// Logarithmic x axis.
    pub fn log_x(mut self) -> Self {
        self.log_x = true;
        self
    }

    /// Logarithmic y axis.
    pub fn log_y(mut self) -> Self {
        self.log_y = true;
        self
    }

    /// Adds a series.
    pub fn series(mut self, label: &str, points: Vec<(f64, f64)>, mark: Mark) -> Self {
        let color = self.series.last().map_or(0, |s| s.color + 1);
        self.series.push(Series {
            label: label.into(),
            points,
            mark,
            color,
        });
        self
    }

    /// Adds a series in the previous series' colour, without a legend entry (an interval or a
    /// fitted line that belongs to it).
    pub fn companion(mut self, points: Vec<(f64, f64)>, mark: Mark) -> Self {
        let color = self.series.last().map_or(0, |s| s.color);
        self.series.push(Series {
            label: String::new(),
            points,
            mark,
            color,
        });
        self
    }

    fn usable(&self, (x, y): (f64, f64)) -> bool {
        x.is_finite() && y.is_finite() && (!self.log_x || x > 0.0) && (!self.log_y || y > 0.0)
    }

    fn range(&self, pick: impl Fn((f64, f64)) -> f64, log: bool) -> Result<Range<f64>> {
        let values: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|p| self.usable(*p))
            .map(pick)
            .collect();
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !lo.is_finite() || !hi.is_finite() {
            return Err(anyhow!("plot `{}` has no finite points", self.title));
        }
        Ok(if log {
            let (lo, hi) = if lo == hi {
                (lo / 2.0, hi * 2.0)
            } else {
                (lo, hi)
            };
            lo / 1.15..hi * 1.15
        } else {
            let pad = if hi > lo {
                0.05 * (hi - lo)
            } else {
                0.5 * lo.abs().max(1.0)
            };
            lo - pad..hi + pad
        })
    }

    /// Renders the plot to a PNG file of 900×600 pixels.
    pub fn save(&self, path: &Path) -> Result<()> {
        register_font();
        let x_range = self.range(|p| p.0, self.log_x)?;
        let y_range = self.range(|p| p.1, self.log_y)?;
        let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e:?}"))?;
        // plotters needs a concrete coordinate type per axis kind; four cases, one body.
        match (self.log_x, self.log_y) {
            (false, false) => self.draw(&root, x_range, y_range),
            (true, false) => self.draw(&root, x_range.log_scale(), y_range),
            (false, true) => self.draw(&root, x_range, y_range.log_scale()),
            (true, true) => self.draw(&root, x_range.log_scale(), y_range.log_scale()),
        }?;
        root.present()
            .map_err(|e| anyhow!("writing {}: {e:?}", path.display()))?;
        Ok(())
    }

    fn draw<X, Y>(
        &self,
        root: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
        x: X,
        y: Y,
    ) -> Result<()>
    where
        X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
        Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
        X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
        Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
    {
        let err = |e: &dyn std::fmt::Debug| anyhow!("plot `{}`: {e:?}", self.title);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x, y)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&tick_label)
            .y_label_formatter(&tick_label)
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
        for s in &self.series {
            let color = PALETTE[s.color % PALETTE.len()].to_rgba();
            let points: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|p| self.usable(*p))
                .collect();
            let legend_color = color;
            match s.mark {
                Mark::Line | Mark::Reference => {
                    let width = if s.mark == Mark::Line { 2 } else { 1 };
                    let drawn = chart
                        .draw_series(LineSeries::new(points, color.stroke_width(width)))
                        .map_err(|e| err(&e))?;
                    if !s.label.is_empty() {
                        drawn.label(&s.label).legend(move |(x, y)| {
                            PathElement::new(
                                vec![(x, y), (x + 20, y)],
                                legend_color.stroke_width(2),
                            )
                        });
                    }
                }
                Mark::Points => {
                    let drawn = chart
                        .draw_series(
                            points
                                .into_iter()
                                .map(|p| Circle::new(p, 4, color.filled())),
                        )
                        .map_err(|e| err(&e))?;
                    if !s.label.is_empty() {
                        drawn.label(&s.label).legend(move |(x, y)| {
                            Circle::new((x + 10, y), 4, legend_color.filled())
                        });
                    }
                }
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
        Ok(())
    }
}

/// Axis tick labels: plain decimals between 1e-3 and 1e4, scientific notation outside, so log
/// axes spanning many decades stay readable.
fn tick_label(v: &f64) -> String {
    let a = v.abs();
    if *v == 0.0 {
        "0".to_string()
    } else if (1e-3..1e4).contains(&a) {
        let s = format!("{v:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{v:.0e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_is_written_as_png() {
        let path = std::env::temp_dir().join(format!("kappa-plot-{}.png", std::process::id()));
        LinePlot::new("test", "x", "y")
            .log_y()
            .series(
                "line",
                vec![(1.0, 1.0), (2.0, 10.0), (3.0, f64::NAN)],
                Mark::Line,
            )
            .series("points", vec![(1.5, 3.0), (2.5, 0.0)], Mark::Points)
            .save(&path)
            .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn tick_labels_switch_to_scientific_notation_outside_four_decades() {
        assert_eq!(tick_label(&2.5), "2.5");
        assert_eq!(tick_label(&1000.0), "1000");
        assert_eq!(tick_label(&0.0), "0");
        assert_eq!(tick_label(&1e5), "1e5");
        assert_eq!(tick_label(&3e-6), "3e-6");
    }

    #[test]
    fn a_plot_without_finite_points_is_an_error() {
        let path = std::env::temp_dir().join("kappa-never-written.png");
        let err = LinePlot::new("empty", "x", "y")
            .series("nan", vec![(f64::NAN, 1.0)], Mark::Line)
            .save(&path)
            .unwrap_err();
        assert!(err.to_string().contains("no finite points"));
    }
}
