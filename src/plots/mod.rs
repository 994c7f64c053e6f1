//! Charts: data in, pixels out. Each draws through plotters into a [`Scene`] (a display list,
//! one backend so the drawing code is compiled once); the browser paints the scene on a
//! `<canvas>`, the exports and the native tests write it as SVG and assert on what it holds. Nothing here runs the estimator: the numbers come from
//! [`crate::estimator::sweep`] (or an estimate's own timeline), and each chart only draws them.
//!
//! Each chart is a data struct (a sweep plus what it is drawn with: the unit, the names, the
//! "you are here" marker), a `*_header` (title, legend and notes), a
//! `draw_*<DB: DrawingBackend>(root, data, theme) -> (Frame, Layout)` that draws it and returns
//! where it put the data (the hover read-out maps pixels back through the [`Frame`]) and its
//! text (the [`Layout`], checked for overlaps), a `*_svg` for export and tests, and a [`Table`]
//! of the numbers it drew (read-out and CSV). [`ChartKind`] names them and [`ChartData`]
//! dispatches over them. The stacked bar ([`bar`]) and the benchmark's charts ([`bench`]) follow
//! the same pattern.

pub mod axis;
pub mod bar;
pub mod batch;
pub mod bench;
pub mod chart;
pub mod draw;
pub mod format;
pub mod gpus;
pub mod params;
pub mod plan;
pub mod scene;
pub mod seq;
pub mod serve;
pub mod table;
pub mod theme;
pub mod timeline;

pub use axis::{Axis, Frame};
pub use chart::{ChartData, ChartKind};
pub use draw::{svg_of, Header, Layout, Rect};
pub use format::{gpu_name, params_label, tokens_label, y_of, zero_label};
pub use scene::{draw_scene, Scene};
pub use table::{Column, Reading, Table};
pub use theme::{category_color, hex, okabe_ito, Theme, DARK, LIGHT, PROJECTOR};
