//! Without the `dist` feature there is no sharding: [`Sharding`] is a type without values, so
//! the group's step compiles the same way with and without the feature.

use tch::Tensor;

use super::jobs::{Jobs, StepBatch};
use super::stats::Accumulator;
use crate::error::Result;

/// Without the `dist` feature there is no sharding: a type without values.
#[derive(Debug)]
pub(super) enum Sharding {}

impl Sharding {
    pub(super) fn begin_step(&mut self) {
        match *self {}
    }

    pub(super) fn merge_stats(
        &self,
        _: &mut [(&mut Accumulator, &mut Accumulator)],
        _: tch::Device,
    ) -> Result<()> {
        match *self {}
    }

    pub(super) fn run<S>(
        &mut self,
        _: Jobs<'_, '_, S>,
        _: &str,
        _: bool,
        _: &mut Accumulator,
        _: impl Fn(&Tensor) -> Option<usize>,
        _: impl StepBatch<S>,
    ) -> Result<()> {
        match *self {}
    }
}
