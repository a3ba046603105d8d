//! How a parameter tensor is seen as the matrices Muon orthogonalizes: dimension numbers
//! ([`Dims`]: which axes are batch, rows and columns), then blocks of each matrix
//! ([`Split`]: a fused QKV weight as its Q, K and V parts; [`Heads`]: each attention head
//! separately).
//!
//! A parameter of shape (d₀, …, d_k) becomes B matrices of shape m×n, B the product of the
//! batch axes' sizes, m of the row axes', n of the column axes'. Each matrix is cut along
//! `split.axis` into blocks of `split.sizes`, and each block along `heads.axis` into
//! `heads.count` equal blocks. Every block is orthogonalized on its own, with its own momentum.
//!
//! | weight | spec |
//! |---|---|
//! | linear (out, in) | [`MatrixSpec::matrix`] (the default) |
//! | conv (out, in, kh, kw) | [`MatrixSpec::matrix`]: (out, in·kh·kw), as `torch.optim.Muon` flattens |
//! | MoE experts (E, m, n) | [`MatrixSpec::batched`]`(&[0], &[1], &[2])`: E matrices m×n |
//! | fused QKV (3d, d) | `MatrixSpec::matrix().split(Axis::Rows, [d, d, d])` |
//! | fused QKV, per head | `… .split(Axis::Rows, [d, d, d]).heads(Axis::Rows, h)`: 3h blocks (d/h)×d |
//! | output projection (d, d), per head | `MatrixSpec::matrix().heads(Axis::Cols, h)` |
//!
//! When the permuted parameter can be viewed as B×m×n without a copy (always when the axes are in
//! storage order, the common case, and whenever batch, rows and columns are one axis each) the
//! blocks are views of the parameter and are updated in place; otherwise (an axis group that
//! storage does not keep together) the optimizer steps a permuted copy and writes it back.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::error::{libtorch, Result};
use crate::InputError;

/// An axis of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Axis {
    /// The rows (dimension 0 of the m×n matrix).
    Rows,
    /// The columns.
    Cols,
}

impl Axis {
    fn index(self) -> i64 {
        match self {
            Axis::Rows => 0,
            Axis::Cols => 1,
        }
    }
}

/// Which tensor axes form the batch, the rows and the columns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dims {
    /// Rows: axis 0; columns: every other axis, flattened. A rank-1 tensor is refused.
    Flatten,
    /// Explicit dimension numbers: every axis in exactly one list, rows and columns non-empty
    /// (optax's `MuonDimensionNumbers`, with batch axes named too).
    Explicit {
        /// Batch axes: each index over them is its own matrix.
        batch: Vec<usize>,
        /// Row axes (flattened in this order).
        rows: Vec<usize>,
        /// Column axes (flattened in this order).
        cols: Vec<usize>,
    },
}

/// Contiguous blocks of the given sizes along one axis (they must add up to its length).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// The axis that is cut.
    pub axis: Axis,
    /// The blocks' lengths along it, in order.
    pub sizes: Vec<usize>,
}

/// Equal blocks along one axis, one per attention head (applied inside each [`Split`] block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heads {
    /// The axis that is cut.
    pub axis: Axis,
    /// The number of heads (it must divide the axis' length in every block).
    pub count: usize,
}

/// How a parameter is seen as matrices (module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatrixSpec {
    /// Dimension numbers.
    pub dims: Dims,
    /// Blocks of unequal sizes (a fused QKV weight), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
    /// Per-head blocks, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<Heads>,
}

impl Default for MatrixSpec {
    fn default() -> Self {
        Self::matrix()
    }
}

impl MatrixSpec {
    /// One matrix: rows along axis 0, the other axes flattened into columns.
    pub fn matrix() -> Self {
        Self {
            dims: Dims::Flatten,
            split: None,
            heads: None,
        }
    }

    /// Explicit dimension numbers ([`Dims::Explicit`]).
    pub fn batched(batch: &[usize], rows: &[usize], cols: &[usize]) -> Self {
        Self {
            dims: Dims::Explicit {
                batch: batch.to_vec(),
                rows: rows.to_vec(),
                cols: cols.to_vec(),
            },
            split: None,
            heads: None,
        }
    }

    /// This spec with each matrix cut into blocks of `sizes` along `axis`.
    pub fn split(self, axis: Axis, sizes: impl Into<Vec<usize>>) -> Self {
        let sizes = sizes.into();
        Self {
            split: Some(Split { axis, sizes }),
            ..self
        }
    }

    /// This spec with each block cut into `count` heads along `axis`.
    pub fn heads(self, axis: Axis, count: usize) -> Self {
        Self {
            heads: Some(Heads { axis, count }),
            ..self
        }
    }

    /// The layout of a parameter of shape `size` under this spec, or an
    /// [`InputError::InvalidArgument`] (argument `matrix`) saying why the shape does not fit.
    pub fn resolve(&self, size: &[i64]) -> Result<Resolved> {
        let bad = |reason: String| -> crate::OptimError {
            InputError::invalid("matrix", format!("a tensor of shape {size:?}: {reason}")).into()
        };
        let rank = size.len();
        let (batch, rows, cols): (Vec<usize>, Vec<usize>, Vec<usize>) = match &self.dims {
            Dims::Flatten if rank < 2 => {
                return Err(bad("Muon needs rank ≥ 2 (give it to AdamW)".into()))
            }
            Dims::Flatten => (vec![], vec![0], (1..rank).collect()),
            Dims::Explicit { batch, rows, cols } => (batch.clone(), rows.clone(), cols.clone()),
        };
        let mut seen = vec![false; rank];
        for &a in batch.iter().chain(&rows).chain(&cols) {
            match seen.get_mut(a) {
                None => return Err(bad(format!("axis {a} does not exist"))),
                Some(true) => return Err(bad(format!("axis {a} is named twice"))),
                Some(s) => *s = true,
            }
        }
        if let Some(a) = seen.iter().position(|s| !s) {
            return Err(bad(format!("axis {a} is in none of batch, rows, cols")));
        }
        if rows.is_empty() || cols.is_empty() {
            return Err(bad("rows and cols each need at least one axis".into()));
        }
        let product = |axes: &[usize]| axes.iter().map(|&a| size[a]).product::<i64>();
        let (b, m, n) = (product(&batch), product(&rows), product(&cols));
        if m == 0 || n == 0 {
            return Err(bad("an empty matrix".into()));
        }
        let perm: Vec<i64> = batch
            .iter()
            .chain(&rows)
            .chain(&cols)
            .map(|&a| a as i64)
            .collect();
        let blocks = self.blocks(m, n).map_err(bad)?;
        Ok(Resolved {
            identity: perm.iter().enumerate().all(|(i, &a)| i as i64 == a),
            perm,
            shape: [b, m, n],
            blocks,
        })
    }

    /// The blocks (row start, rows, column start, columns) of an m×n matrix.
    fn blocks(&self, m: i64, n: i64) -> std::result::Result<Vec<Block>, String> {
        let extent = [m, n];
        let whole = Block {
            start: [0, 0],
            len: [m, n],
        };
        let mut blocks = match &self.split {
            None => vec![whole],
            Some(s) => {
                let axis = s.axis.index() as usize;
                // Summed in u128: sizes near usize::MAX must not wrap into a plausible total.
                let total: u128 = s.sizes.iter().map(|&x| x as u128).sum();
                if s.sizes.contains(&0) || total != extent[axis] as u128 {
                    return Err(format!(
                        "split sizes {:?} do not add up to the {} {:?} has ({})",
                        s.sizes,
                        ["rows", "columns"][axis],
                        s.axis,
                        extent[axis]
                    ));
                }
                let mut at = 0;
                s.sizes
                    .iter()
                    .map(|&len| {
                        let mut b = whole;
                        b.start[axis] = at;
                        b.len[axis] = len as i64;
                        at += len as i64;
                        b
                    })
                    .collect()
            }
        };
        if let Some(h) = self.heads {
            let axis = h.axis.index() as usize;
            let mut out = Vec::new();
            for b in blocks {
                let count = i64::try_from(h.count).unwrap_or(i64::MAX);
                if count == 0 || count > b.len[axis] || b.len[axis] % count != 0 {
                    return Err(format!(
                        "{} heads do not divide a block of {} along {:?}",
                        h.count, b.len[axis], h.axis
                    ));
                }
                let each = b.len[axis] / count;
                for i in 0..count {
                    let mut head = b;
                    head.start[axis] += i * each;
                    head.len[axis] = each;
                    out.push(head);
                }
            }
            blocks = out;
        }
        Ok(blocks)
    }
}

/// One block of an m×n matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// First row and first column.
    pub start: [i64; 2],
    /// Rows and columns.
    pub len: [i64; 2],
}

/// A [`MatrixSpec`] applied to one parameter shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The tensor's axes in the order batch, rows, columns.
    pub perm: Vec<i64>,
    /// Whether `perm` is the identity (the matrices are then views of the parameter).
    pub identity: bool,
    /// (B, m, n).
    pub shape: [i64; 3],
    /// The blocks of each of the B matrices.
    pub blocks: Vec<Block>,
}

impl Resolved {
    /// The number of blocks over all B matrices (one optimizer state each).
    pub fn count(&self) -> usize {
        self.shape[0] as usize * self.blocks.len()
    }

    /// `t` (the parameter or its gradient) as the B×m×n stack, and whether it is a view of
    /// `t` (updates through it reach `t`) rather than a copy.
    pub fn stack(&self, t: &Tensor, arg: &'static str) -> Result<(Tensor, bool)> {
        let permuted = if self.identity {
            t.shallow_clone()
        } else {
            t.f_permute(&self.perm).map_err(libtorch(arg))?
        };
        match permuted.f_view(self.shape) {
            Ok(v) => Ok((v, true)),
            Err(_) => Ok((
                permuted
                    .f_reshape(self.shape)
                    .map_err(libtorch(arg))?
                    .f_contiguous()
                    .map_err(libtorch(arg))?,
                false,
            )),
        }
    }

    /// The blocks of a B×m×n stack, in order (matrix by matrix, block by block): views.
    pub fn views(&self, stack: &Tensor, arg: &'static str) -> Result<Vec<Tensor>> {
        let mut out = Vec::with_capacity(self.count());
        for b in 0..self.shape[0] {
            let matrix = stack.f_select(0, b).map_err(libtorch(arg))?;
            for block in &self.blocks {
                let v = matrix
                    .f_narrow(0, block.start[0], block.len[0])
                    .and_then(|v| v.f_narrow(1, block.start[1], block.len[1]))
                    .map_err(libtorch(arg))?;
                out.push(v);
            }
        }
        Ok(out)
    }

    /// Copies a stack that was not a view back into the parameter `t`.
    pub fn write_back(&self, t: &Tensor, stack: &Tensor) -> Result<()> {
        let permuted_size: Vec<i64> = {
            let size = t.size();
            self.perm.iter().map(|&a| size[a as usize]).collect()
        };
        let target = t.f_permute(&self.perm).map_err(libtorch("w"))?;
        let source = stack
            .f_view(permuted_size.as_slice())
            .map_err(libtorch("w"))?;
        target
            .shallow_clone()
            .f_copy_(&source)
            .map_err(libtorch("w"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qkv_heads_are_thirty_six_row_blocks() {
        let spec = MatrixSpec::matrix()
            .split(Axis::Rows, [768, 768, 768])
            .heads(Axis::Rows, 12);
        let r = spec.resolve(&[2304, 768]).unwrap();
        assert_eq!(r.count(), 36);
        assert_eq!(
            r.blocks[13],
            Block {
                start: [768 + 64, 0],
                len: [64, 768]
            }
        );
        assert!(r.identity);
    }

    #[test]
    fn shapes_the_spec_cannot_handle_are_errors() {
        let cases: [(MatrixSpec, &[i64]); 9] = [
            (MatrixSpec::matrix(), &[5]),
            // Counts and sizes no shape can have: an error, never an allocation of that size.
            (MatrixSpec::matrix().heads(Axis::Rows, 1 << 40), &[4, 3]),
            (MatrixSpec::matrix().heads(Axis::Rows, usize::MAX), &[4, 3]),
            // usize::MAX + 5 wraps to 4 in usize arithmetic: the sum must not.
            (
                MatrixSpec::matrix().split(Axis::Rows, [usize::MAX, 5]),
                &[4, 3],
            ),
            (MatrixSpec::matrix().split(Axis::Rows, [2, 2]), &[5, 3]),
            (MatrixSpec::matrix().heads(Axis::Cols, 2), &[4, 3]),
            (MatrixSpec::batched(&[0], &[1], &[1]), &[2, 3, 4]),
            (MatrixSpec::batched(&[0], &[1], &[]), &[2, 3]),
            (MatrixSpec::batched(&[], &[0], &[3]), &[2, 3]),
        ];
        for (spec, size) in cases {
            let e = spec.resolve(size).unwrap_err().to_string();
            assert!(
                e.contains("matrix") && e.contains(&format!("{size:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_permuted_spec_is_a_strided_view_or_a_copy_written_back() {
        let t = Tensor::arange(60, (tch::Kind::Float, tch::Device::Cpu)).view([3, 4, 5]);
        // One axis per role: a permutation, still a view of `t`.
        let r = MatrixSpec::batched(&[2], &[0], &[1])
            .resolve(&[3, 4, 5])
            .unwrap();
        assert_eq!(r.shape, [5, 3, 4]);
        assert!(r.stack(&t, "w").unwrap().1);
        // Rows from axes 0 and 2, which storage does not keep together: a copy.
        let r = MatrixSpec::batched(&[], &[0, 2], &[1])
            .resolve(&[3, 4, 5])
            .unwrap();
        assert_eq!(r.shape, [1, 15, 4]);
        let (stack, view) = r.stack(&t, "w").unwrap();
        assert!(!view);
        let _ = stack.shallow_clone().f_mul_scalar_(2.0).unwrap();
        r.write_back(&t, &stack).unwrap();
        assert_eq!(t.double_value(&[1, 2, 3]), 2.0 * 33.0);
    }
}
