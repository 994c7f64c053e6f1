//! Which panels the page shows, and in what order: [`Layout`] and [`Panel`], pure and natively
//! tested under [`crate::course`] (a course link's `sections=`, `hide=` and `view=` build a
//! layout from the same names); [`super::app`] renders whatever a layout lists.

pub use crate::course::layout::Layout;
pub use crate::course::panel::Panel;
