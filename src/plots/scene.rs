//! A display list. Every chart draws into a [`Scene`] through one plotters backend
//! ([`SceneBackend`]), so the drawing code is compiled once; the page paints the scene on a
//! canvas (`ui::canvas`) and the exports and the native tests write it as SVG
//! ([`Scene::svg`], in the same form plotters' SVG backend writes).

use plotters::coord::Shift;
use plotters::prelude::{DrawingArea, IntoDrawingArea};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind, FontStyle, FontTransform,
};
use std::cell::RefCell;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::rc::Rc;

/// A colour with its opacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paint {
    pub rgb: (u8, u8, u8),
    pub alpha: f64,
}

impl Paint {
    fn of(c: BackendColor) -> Paint {
        Paint { rgb: c.rgb, alpha: c.alpha }
    }

    /// `#RRGGBB` (upper case, as plotters writes it).
    pub fn hex(&self) -> String {
        let (r, g, b) = self.rgb;
        format!("#{r:02X}{g:02X}{b:02X}")
    }

    /// `rgba(r,g,b,a)` for a canvas' fill and stroke styles.
    pub fn css(&self) -> String {
        let (r, g, b) = self.rgb;
        format!("rgba({r},{g},{b},{})", self.alpha)
    }
}

/// How a text is anchored at its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Start,
    Center,
    End,
}

/// Where the text's position is vertically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    Top,
    Middle,
    Bottom,
}

/// One drawn thing, in the drawing's pixels.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    Line {
        from: BackendCoord,
        to: BackendCoord,
        paint: Paint,
        width: u32,
    },
    Path {
        points: Vec<BackendCoord>,
        paint: Paint,
        width: u32,
    },
    Rect {
        from: BackendCoord,
        to: BackendCoord,
        paint: Paint,
        fill: bool,
        width: u32,
    },
    Polygon {
        points: Vec<BackendCoord>,
        paint: Paint,
    },
    Circle {
        center: BackendCoord,
        radius: u32,
        paint: Paint,
        fill: bool,
        width: u32,
    },
    Text {
        text: String,
        at: BackendCoord,
        size: f64,
        bold: bool,
        family: String,
        paint: Paint,
        align: Align,
        baseline: Baseline,
        degrees: u16,
    },
}

/// A chart, drawn: its size and its shapes in painting order.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Scene {
    pub size: (u32, u32),
    pub shapes: Vec<Shape>,
}

/// The backend that records a [`Scene`].
pub struct SceneBackend {
    size: (u32, u32),
    shapes: Rc<RefCell<Vec<Shape>>>,
}

type Drawn = Result<(), DrawingErrorKind<Infallible>>;

impl SceneBackend {
    fn push(&mut self, paint: BackendColor, shape: impl FnOnce(Paint) -> Shape) -> Drawn {
        if paint.alpha > 0.0 {
            self.shapes.borrow_mut().push(shape(Paint::of(paint)));
        }
        Ok(())
    }
}

impl DrawingBackend for SceneBackend {
    type ErrorType = Infallible;

    fn get_size(&self) -> (u32, u32) {
        self.size
    }
    fn ensure_prepared(&mut self) -> Drawn {
        Ok(())
    }
    fn present(&mut self) -> Drawn {
        Ok(())
    }
    fn draw_pixel(&mut self, at: BackendCoord, color: BackendColor) -> Drawn {
        self.push(color, |paint| Shape::Rect { from: at, to: (at.0 + 1, at.1 + 1), paint, fill: true, width: 0 })
    }
    fn draw_line<S: BackendStyle>(&mut self, from: BackendCoord, to: BackendCoord, style: &S) -> Drawn {
        let width = style.stroke_width();
        self.push(style.color(), |paint| Shape::Line { from, to, paint, width })
    }
    fn draw_rect<S: BackendStyle>(&mut self, from: BackendCoord, to: BackendCoord, style: &S, fill: bool) -> Drawn {
        let width = style.stroke_width();
        self.push(style.color(), |paint| Shape::Rect { from, to, paint, fill, width })
    }
    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(&mut self, path: I, style: &S) -> Drawn {
        let width = style.stroke_width();
        let points = path.into_iter().collect();
        self.push(style.color(), |paint| Shape::Path { points, paint, width })
    }
    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(&mut self, vert: I, style: &S) -> Drawn {
        let points = vert.into_iter().collect();
        self.push(style.color(), |paint| Shape::Polygon { points, paint })
    }
    fn draw_circle<S: BackendStyle>(&mut self, center: BackendCoord, radius: u32, style: &S, fill: bool) -> Drawn {
        let width = style.stroke_width();
        self.push(style.color(), |paint| Shape::Circle { center, radius, paint, fill, width })
    }
    fn draw_text<S: BackendTextStyle>(&mut self, text: &str, style: &S, at: BackendCoord) -> Drawn {
        let align = match style.anchor().h_pos {
            HPos::Left => Align::Start,
            HPos::Center => Align::Center,
            HPos::Right => Align::End,
        };
        let baseline = match style.anchor().v_pos {
            VPos::Top => Baseline::Top,
            VPos::Center => Baseline::Middle,
            VPos::Bottom => Baseline::Bottom,
        };
        let degrees = match style.transform() {
            FontTransform::None => 0,
            FontTransform::Rotate90 => 90,
            FontTransform::Rotate180 => 180,
            FontTransform::Rotate270 => 270,
        };
        let (size, bold, family) = (style.size(), matches!(style.style(), FontStyle::Bold), style.family().as_str().to_string());
        self.push(style.color(), |paint| Shape::Text { text: text.to_string(), at, size, bold, family, paint, align, baseline, degrees })
    }
}

/// The drawing area of a scene.
pub type Area = DrawingArea<SceneBackend, Shift>;

/// Draws `draw` into a scene of `size` pixels; returns the scene and what `draw` returned.
pub fn draw_scene<T>(size: (u32, u32), draw: impl FnOnce(&Area) -> T) -> (Scene, T) {
    let shapes = Rc::new(RefCell::new(Vec::new()));
    let out = {
        let root = SceneBackend { size, shapes: shapes.clone() }.into_drawing_area();
        draw(&root)
    };
    let shapes = Rc::try_unwrap(shapes).map_or_else(|rc| rc.borrow().clone(), RefCell::into_inner);
    (Scene { size, shapes }, out)
}

fn escape(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
}

fn points(out: &mut String, pts: &[BackendCoord]) {
    for (x, y) in pts {
        let _ = write!(out, "{x},{y} ");
    }
}

impl Scene {
    /// The scene as an SVG document.
    pub fn svg(&self) -> String {
        let (w, h) = self.size;
        let mut s = format!("<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" xmlns=\"http://www.w3.org/2000/svg\">\n");
        for shape in &self.shapes {
            match shape {
                Shape::Line { from, to, paint, width } => {
                    let _ = writeln!(
                        s,
                        "<line opacity=\"{}\" stroke=\"{}\" stroke-width=\"{width}\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>",
                        paint.alpha,
                        paint.hex(),
                        from.0,
                        from.1,
                        to.0,
                        to.1
                    );
                }
                Shape::Path { points: pts, paint, width } => {
                    let _ = write!(
                        s,
                        "<polyline fill=\"none\" opacity=\"{}\" stroke=\"{}\" stroke-width=\"{width}\" points=\"",
                        paint.alpha,
                        paint.hex()
                    );
                    points(&mut s, pts);
                    s.push_str("\"/>\n");
                }
                Shape::Rect { from, to, paint, fill, .. } => {
                    let (f, k) = if *fill { (paint.hex(), "none".to_string()) } else { ("none".to_string(), paint.hex()) };
                    let _ = writeln!(
                        s,
                        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" opacity=\"{}\" fill=\"{f}\" stroke=\"{k}\"/>",
                        from.0,
                        from.1,
                        to.0 - from.0,
                        to.1 - from.1,
                        paint.alpha
                    );
                }
                Shape::Polygon { points: pts, paint } => {
                    let _ = write!(s, "<polygon opacity=\"{}\" fill=\"{}\" points=\"", paint.alpha, paint.hex());
                    points(&mut s, pts);
                    s.push_str("\"/>\n");
                }
                Shape::Circle { center, radius, paint, fill, width } => {
                    let (k, f) = if *fill { ("none".to_string(), paint.hex()) } else { (paint.hex(), "none".to_string()) };
                    let _ = writeln!(
                        s,
                        "<circle cx=\"{}\" cy=\"{}\" r=\"{radius}\" opacity=\"{}\" fill=\"{f}\" stroke=\"{k}\" stroke-width=\"{width}\"/>",
                        center.0, center.1, paint.alpha
                    );
                }
                Shape::Text { text, at, size, bold, family, paint, align, baseline, degrees } => {
                    let anchor = match align {
                        Align::Start => "start",
                        Align::Center => "middle",
                        Align::End => "end",
                    };
                    let dy = match baseline {
                        Baseline::Top => "0.76em",
                        Baseline::Middle => "0.5ex",
                        Baseline::Bottom => "-0.5ex",
                    };
                    // plotters' SVG backend sets a font size of size / 1.24 (its sizes are
                    // line heights); the same here keeps exports as they were.
                    let _ = write!(
                        s,
                        "<text x=\"{}\" y=\"{}\" dy=\"{dy}\" text-anchor=\"{anchor}\" font-family=\"{family}\" font-size=\"{}\" opacity=\"{}\" fill=\"{}\"",
                        at.0,
                        at.1,
                        size / 1.24,
                        paint.alpha,
                        paint.hex()
                    );
                    if *bold {
                        s.push_str(" font-weight=\"bold\"");
                    }
                    if *degrees != 0 {
                        let _ = write!(s, " transform=\"rotate({degrees}, {}, {})\"", at.0, at.1);
                    }
                    s.push_str(">\n");
                    escape(&mut s, text);
                    s.push_str("\n</text>\n");
                }
            }
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::{draw_scene, Shape};
    use plotters::prelude::{Circle, Color, IntoFont, PathElement, RGBAColor, Rectangle, Text, BLACK, BLUE, RED, WHITE};

    #[test]
    fn a_scene_records_what_is_drawn_and_writes_it_as_svg() {
        let (scene, _) = draw_scene((100, 50), |root| {
            root.fill(&WHITE).ok();
            root.draw(&PathElement::new(vec![(0, 0), (10, 20)], RED.stroke_width(2))).ok();
            root.draw(&Text::new("a < b", (5, 5), ("sans-serif", 12).into_font().color(&BLACK))).ok();
            root.draw(&Circle::new((50, 25), 4, BLUE.filled())).ok();
        });
        assert_eq!(scene.size, (100, 50));
        assert!(matches!(scene.shapes[0], Shape::Rect { fill: true, .. }));
        assert!(matches!(&scene.shapes[1], Shape::Path { points, width: 2, .. } if points == &vec![(0, 0), (10, 20)]));
        let svg = scene.svg();
        assert!(svg.starts_with("<svg width=\"100\" height=\"50\""));
        assert!(svg.contains("stroke=\"#FF0000\" stroke-width=\"2\" points=\"0,0 10,20 \""));
        assert!(svg.contains("a &lt; b"));
        assert!(svg.contains("<circle cx=\"50\" cy=\"25\" r=\"4\""));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn transparent_shapes_are_not_recorded() {
        let (scene, _) = draw_scene((10, 10), |root| {
            root.draw(&Rectangle::new([(0, 0), (5, 5)], RGBAColor(0, 0, 0, 0.0).filled())).ok();
        });
        assert!(scene.shapes.is_empty());
    }
}
