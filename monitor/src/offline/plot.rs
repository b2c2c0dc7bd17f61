//! SVG plots of detector frontiers (`monitor replay --frontier --svg FILE`): false suspicions
//! per hour, on a log scale with "0" as a floor at the bottom, against detection time; one
//! panel per trace, one curve per detector family. Text is written as SVG `<text>`: no font
//! files are read.

use plotters::prelude::*;

/// One family's frontier: (detection ms, false suspicions per hour), by detection time.
#[derive(Debug, Clone)]
pub struct Curve {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One trace's frontiers.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    /// The smallest non-zero rate the trace can show (one mistake in its alive time), per hour:
    /// the log axis reaches at least a decade below it.
    pub min_rate: f64,
    pub curves: Vec<Curve>,
}

const PANEL_SIZE: (u32, u32) = (960, 560);

/// Distinct on white, in the order families come.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
];

/// The y axis: log10 of the rate, with rate 0 at `floor` (a whole decade below every
/// non-zero rate shown).
struct LogAxis {
    floor: i32,
    top: i32,
}

impl LogAxis {
    fn of(panel: &Panel) -> Self {
        let rates = panel
            .curves
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.1));
        let positive = rates.clone().filter(|&r| r > 0.0);
        let low = positive
            .clone()
            .fold(panel.min_rate.max(f64::MIN_POSITIVE), f64::min);
        let high = positive.fold(low, f64::max);
        let floor = low.log10().floor() as i32 - 1;
        let top = (high.log10().ceil() as i32).max(floor + 2);
        Self { floor, top }
    }

    fn y(&self, rate: f64) -> f64 {
        if rate > 0.0 {
            rate.log10()
        } else {
            self.floor as f64
        }
    }

    fn label(&self, y: f64) -> String {
        let k = y.round() as i32;
        if (y - k as f64).abs() > 1e-6 {
            String::new()
        } else if k <= self.floor {
            "0".into()
        } else if (-3..=5).contains(&k) {
            let v = 10f64.powi(k);
            format!("{}", v)
        } else {
            format!("1e{k}")
        }
    }
}

/// Renders the panels, one under the other, as an SVG document.
pub fn frontier_svg(panels: &[Panel]) -> Result<String, String> {
    let mut svg = String::new();
    {
        let size = (PANEL_SIZE.0, PANEL_SIZE.1 * panels.len().max(1) as u32);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let areas = root.split_evenly((panels.len().max(1), 1));
        for (panel, area) in panels.iter().zip(areas.iter()) {
            draw_panel(panel, area).map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_panel(panel: &Panel, area: &Area<'_>) -> Result<(), Box<dyn std::error::Error>> {
    let axis = LogAxis::of(panel);
    // Detection times only: the frontiers often sit far from 0.
    let xs = || {
        panel
            .curves
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.0))
    };
    let (lo, hi) = (
        xs().fold(f64::INFINITY, f64::min),
        xs().fold(f64::NEG_INFINITY, f64::max),
    );
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    let margin = (hi - lo).max(10.0) * 0.05;
    let (x_min, x_max) = ((lo - margin).max(0.0), hi + margin);
    let (y_lo, y_hi) = (axis.floor as f64 - 0.12, axis.top as f64 + 0.1);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(46)
        .y_label_area_size(64)
        .build_cartesian_2d(x_min..x_max, y_lo..y_hi)?;
    let label = |y: &f64| axis.label(*y);
    chart
        .configure_mesh()
        .x_desc("detection time after the crash (ms)")
        .y_desc("false suspicions per hour")
        // As many labels as decades: the mesh picks a step of 1, one label per decade.
        .y_labels((axis.top - axis.floor + 1) as usize)
        .y_label_formatter(&label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .max_light_lines(0)
        .bold_line_style(RGBColor(225, 225, 225))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    // The floor: settings without a single false suspicion sit on this line.
    let grey = RGBColor(150, 150, 150);
    chart.draw_series(DashedLineSeries::new(
        [(x_min, axis.floor as f64), (x_max, axis.floor as f64)],
        6,
        4,
        grey.stroke_width(1),
    ))?;
    for (i, curve) in panel.curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        // A staircase: with a detection budget D, the best rate is that of the last point
        // at or before D.
        let mut steps: Vec<(f64, f64)> = Vec::with_capacity(curve.points.len() * 2);
        for (j, &(d, r)) in curve.points.iter().enumerate() {
            if j > 0 {
                steps.push((d, axis.y(curve.points[j - 1].1)));
            }
            steps.push((d, axis.y(r)));
        }
        chart
            .draw_series(LineSeries::new(steps, color.stroke_width(2)))?
            .label(&curve.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            curve
                .points
                .iter()
                .map(|&(d, r)| Circle::new((d, axis.y(r)), 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_puts_zero_a_decade_below_the_least_rate() {
        let panel = Panel {
            title: "t".into(),
            min_rate: 12.0,
            curves: vec![Curve {
                label: "fixed".into(),
                points: vec![(100.0, 480.0), (200.0, 0.0)],
            }],
        };
        let axis = LogAxis::of(&panel);
        assert_eq!((axis.floor, axis.top), (0, 3));
        assert_eq!(axis.label(0.0), "0");
        assert_eq!(axis.label(2.0), "100");
        assert_eq!(axis.y(0.0), 0.0);
        let svg = frontier_svg(&[panel.clone(), panel]).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("fixed"), "{svg}");
        // The floor's label: text is written on its own line.
        assert!(svg.contains(">\n0\n</text>"), "{svg}");
    }
}
