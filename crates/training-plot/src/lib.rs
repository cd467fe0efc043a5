//! A dormouse training log drawn as a chart. [`log::read`] turns the JSON Lines log of
//! `dormouse train --log` into [`Curves`]; [`chart::svg`] and [`chart::png`] draw them. The crate
//! reads and draws only: where the files go, and how they are written, is the caller's.

pub mod chart;
pub mod log;

pub use chart::{PlotError, png, svg};
pub use log::{Curves, LogError, read};
