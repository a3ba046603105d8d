//! The checks of the tensors that callers hand to the models (token ids, targets, labels,
//! images) that libtorch would otherwise reject with a panic: the device, and the kind and range
//! of integer indices. Each failure is a [`ModelsError::Shape`] naming the argument.

use tch::{Device, Kind, Tensor};

use crate::error::{ModelsError, Result};

/// Checks that `t` lives on `device` (the model's). `what` names its entries in the message.
pub(crate) fn on_device(t: &Tensor, arg: &'static str, what: &str, device: Device) -> Result<()> {
    if t.device() != device {
        return Err(ModelsError::Shape {
            arg,
            reason: format!(
                "expected {what} on the model's device {device:?}, found them on {:?}",
                t.device()
            ),
        });
    }
    Ok(())
}

/// Checks that `ids` is an Int64 tensor on `device` whose entries lie in [0, `bound`), apart
/// from those equal to `ignore`. `what` names the entries in the messages (`token ids`,
/// `labels`). An empty tensor, or one whose entries are all `ignore`, passes the range check.
pub(crate) fn indices(
    ids: &Tensor,
    arg: &'static str,
    what: &str,
    bound: usize,
    ignore: Option<i64>,
    device: Device,
) -> Result<()> {
    if ids.kind() != Kind::Int64 {
        return Err(ModelsError::Shape {
            arg,
            reason: format!("expected Int64 {what}, found {:?}", ids.kind()),
        });
    }
    on_device(ids, arg, what, device)?;
    // One reduction, one read back to the host: the common case costs a single sync.
    let bound = i64::try_from(bound).unwrap_or(i64::MAX);
    let mut bad = ids.f_lt(0i64)?.f_logical_or(&ids.f_ge(bound)?)?;
    if let Some(skip) = ignore {
        bad = bad.f_logical_and(&ids.f_ne(skip)?)?;
    }
    if bad.f_any()?.f_int64_value(&[])? == 0 {
        return Ok(());
    }
    let kept = match ignore {
        Some(skip) => ids.f_masked_select(&ids.f_ne(skip)?)?,
        None => ids.shallow_clone(),
    };
    let lo = kept.f_min()?.f_int64_value(&[])?;
    let hi = kept.f_max()?.f_int64_value(&[])?;
    let apart = ignore
        .map(|skip| format!(" (or be {skip})"))
        .unwrap_or_default();
    Err(ModelsError::Shape {
        arg,
        reason: format!("{what} must lie in [0, {bound}){apart}, found [{lo}, {hi}]"),
    })
}

/// Checks that `labels` holds `batch` class indices (a vector of Int64 on `device`), each in
/// [0, `classes`): the labels of a classifier's loss.
pub(crate) fn labels(labels: &Tensor, batch: i64, classes: usize, device: Device) -> Result<()> {
    if labels.size() != [batch] {
        return Err(ModelsError::Shape {
            arg: "labels",
            reason: format!("expected {batch} labels, found {:?}", labels.size()),
        });
    }
    indices(labels, "labels", "labels", classes, None, device)
}
