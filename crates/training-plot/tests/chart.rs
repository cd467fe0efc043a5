//! The chart of a known log (`tests/data/run.jsonl`: 200 steps, 4 evaluations, baselines
//! gzip 2.9, xz 2.6, zstd 2.7): its axes, its legend and the points of its series, read back
//! from the SVG; the PNG's size and that something was drawn on it.

use training_plot::chart::{
    BITS_AXIS, HEIGHT, HELD_OUT_LABEL, LEARNING_RATE_AXIS, LEARNING_RATE_LABEL, STEPS_AXIS,
    TEACHER_LABEL, TRAIN_LABEL, WIDTH, baseline_label,
};

const LOG: &str = include_str!("data/run.jsonl");

fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            t.split_once('>')
                .and_then(|(_, rest)| rest.split_once("</text>"))
        })
        .map(|(text, _)| text.trim().to_string())
        .collect()
}

/// The points of every polyline drawn in `stroke`, largest first.
fn polylines(svg: &str, stroke: &str) -> Vec<Vec<(i64, i64)>> {
    let mut lines: Vec<Vec<(i64, i64)>> = svg
        .split("<polyline")
        .skip(1)
        .filter(|p| p.contains(&format!("stroke=\"{stroke}\"")))
        .map(|p| {
            let points = p
                .split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            points
                .split_whitespace()
                .map(|xy| {
                    let (x, y) = xy.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect()
        })
        .collect();
    lines.sort_by_key(|l| std::cmp::Reverse(l.len()));
    lines
}

#[test]
fn the_svg_has_both_axes_and_every_series_in_its_legend() {
    let curves = training_plot::read(LOG).unwrap();
    let svg = training_plot::svg(&curves).unwrap();
    let texts = texts(&svg);
    for label in [
        STEPS_AXIS,
        BITS_AXIS,
        LEARNING_RATE_AXIS,
        TRAIN_LABEL,
        HELD_OUT_LABEL,
        TEACHER_LABEL,
        LEARNING_RATE_LABEL,
    ] {
        assert!(
            texts.iter().any(|t| t == label),
            "{label:?} missing from {texts:?}"
        );
    }
    for (name, bits) in [("gzip -9", 2.9), ("xz -9", 2.6), ("zstd -19", 2.7)] {
        let label = baseline_label(name, bits);
        assert!(texts.contains(&label), "{label:?} missing from {texts:?}");
    }
    // The step axis runs to the last step; the bits axis from 0 past the first step's 8 bits.
    assert!(texts.iter().any(|t| t == "200"), "{texts:?}");
    assert!(texts.iter().any(|t| t == "8.0"), "{texts:?}");
}

#[test]
fn each_series_has_one_point_per_logged_value_in_order() {
    let curves = training_plot::read(LOG).unwrap();
    let svg = training_plot::svg(&curves).unwrap();
    let train = &polylines(&svg, "#969696")[0];
    let held_out = &polylines(&svg, "#1F77B4")[0];
    let teacher = &polylines(&svg, "#D62728")[0];
    assert_eq!(train.len(), 200);
    assert_eq!(held_out.len(), 4);
    assert_eq!(teacher.len(), 4);
    // Steps run left to right, and the last evaluation is at the last step.
    assert!(train.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(held_out.last().unwrap().0, train.last().unwrap().0);
    // The log's bits per byte fall at every evaluation, so the line goes down the screen
    // (pixel rows grow downward), and the teacher lags above the model.
    assert!(held_out.windows(2).all(|w| w[0].1 < w[1].1), "{held_out:?}");
    assert!(held_out.iter().zip(teacher).all(|(m, t)| t.1 < m.1));
}

#[test]
fn the_png_is_the_chart_s_size_and_not_blank() {
    let curves = training_plot::read(LOG).unwrap();
    let bytes = training_plot::png(&curves).unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((frame.width, frame.height), (WIDTH, HEIGHT));
    let inked = pixels.chunks(3).filter(|p| p != &[255, 255, 255]).count();
    assert!(inked > 10_000, "only {inked} pixels drawn");
}
