//! Bad-input testing: run a call with a deadline, catch its panic, check its answer, and count.
//!
//! A [`Fuzz`] runs each call on a worker thread and classifies it as
//! - **fine**: it returned, and the test's check of the answer passed (an error, or a documented
//!   value);
//! - **wrong**: it returned, but the check failed (for example `Ok` with NaN where an error is
//!   due);
//! - **panic**: it panicked (caught, with its message);
//! - **hang**: it did not return within the deadline (the thread is left behind; the test fails).
//!
//! An abort (a failed allocation, a stack overflow) ends the test process itself, so the test
//! fails then too. [`Fuzz::finish`] panics with a list of every call that was not fine, so one run
//! reports all defects rather than the first.
//!
//! [`matrices`] draws seeded hostile inputs (non-finite, empty, tiny and huge scales, rank
//! deficiency) and [`Layout`] lays the same values out in memory in the ways a caller's view can
//! (column-major, strided, negative stride).
//!
//! ```
//! use kappa_testkit::hostile::{Fuzz, matrices, Layout};
//!
//! let mut fuzz = Fuzz::new("example");
//! for (name, a) in matrices(0, 3, 2) {
//!     for layout in Layout::ALL {
//!         let laid = layout.lay_out(&a);
//!         fuzz.check(format!("sum of {name} ({layout:?})"), move || {
//!             let s: f64 = laid.view().sum();
//!             // Documented: the sum of an array with a NaN is NaN; otherwise it is a number.
//!             if s.is_nan() || s.is_finite() || s.is_infinite() { Ok(()) } else { Err(format!("{s}")) }
//!         });
//!     }
//! }
//! assert!(fuzz.calls() > 0);
//! fuzz.finish();
//! ```

use std::fmt::Display;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use ndarray::{s, Array2, ArrayView2, ShapeBuilder};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The default deadline of one call: far beyond any legitimate call on the test sizes (which take
/// micro- to milliseconds), short enough that a hang is reported within the test's run.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(20);

/// A bad-input run: calls made, and the ones that were not fine.
pub struct Fuzz {
    name: String,
    deadline: Duration,
    calls: usize,
    defects: Vec<String>,
}

impl Fuzz {
    /// A run named `name` (it appears in the failure report), with [`DEFAULT_DEADLINE`].
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            deadline: DEFAULT_DEADLINE,
            calls: 0,
            defects: Vec::new(),
        }
    }

    /// The same run with another per-call deadline.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Runs `call` and records it: `Ok(())` is fine, `Err(why)` a wrong answer, a panic or a
    /// missed deadline a defect. Returns whether the call was fine.
    pub fn check<F>(&mut self, label: impl Display, call: F) -> bool
    where
        F: FnOnce() -> Result<(), String> + Send + 'static,
    {
        self.calls += 1;
        let (tx, rx) = mpsc::channel();
        let spawned = thread::Builder::new()
            .name(format!("fuzz-{}", self.calls))
            .spawn(move || {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
                let _ = tx.send(outcome);
            });
        if let Err(e) = spawned {
            self.defects
                .push(format!("{label}: could not start a thread: {e}"));
            return false;
        }
        let defect = match rx.recv_timeout(self.deadline) {
            Ok(Ok(Ok(()))) => return true,
            Ok(Ok(Err(why))) => format!("wrong answer: {why}"),
            Ok(Err(payload)) => format!("panic: {}", panic_message(payload.as_ref())),
            Err(_) => format!("hang: no answer within {:?}", self.deadline),
        };
        self.defects.push(format!("{label}: {defect}"));
        false
    }

    /// Calls made so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The defects so far, one line each.
    pub fn defects(&self) -> &[String] {
        &self.defects
    }

    /// Ends the run: returns the number of calls when every call was fine, and panics with the
    /// list of defects otherwise.
    pub fn finish(self) -> usize {
        if !self.defects.is_empty() {
            let shown: Vec<&str> = self.defects.iter().take(60).map(String::as_str).collect();
            panic!(
                "{}: {} of {} calls not fine:\n  {}{}",
                self.name,
                self.defects.len(),
                self.calls,
                shown.join("\n  "),
                if self.defects.len() > shown.len() {
                    format!("\n  … and {} more", self.defects.len() - shown.len())
                } else {
                    String::new()
                }
            );
        }
        eprintln!("{}: {} calls, all fine", self.name, self.calls);
        self.calls
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

/// Seeded hostile matrices of (about) `rows × cols`, each with a name saying what it is:
/// Gaussian at unit scale, at 1e±300 and near `f64::MAX`; with a NaN, +∞ or −∞ entry; zero;
/// rank one; a single entry; empty (0 rows, 0 columns); and the transposed shape (for mismatch).
pub fn matrices(seed: u64, rows: usize, cols: usize) -> Vec<(String, Array2<f64>)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (rows, cols) = (rows.max(1), cols.max(1));
    let mut gauss = |r: usize, c: usize| -> Array2<f64> {
        Array2::from_shape_simple_fn((r, c), || rng.gen_range(-1.0..1.0))
    };
    let base = gauss(rows, cols);
    let (u, v) = (gauss(rows, 1), gauss(1, cols));
    // The outer product by hand: `dot` would make this crate need a BLAS when the workspace
    // turns on ndarray's `blas` feature.
    let rank_one = Array2::from_shape_fn((rows, cols), |(r, c)| u[[r, 0]] * v[[0, c]]);
    let (i, j) = (rows / 2, cols / 2);
    let with = |value: f64| {
        let mut a = base.clone();
        a[[i, j]] = value;
        a
    };
    vec![
        ("gaussian".into(), base.clone()),
        ("gaussian×1e300".into(), &base * 1e300),
        ("gaussian×1e-300".into(), &base * 1e-300),
        ("gaussian×f64::MAX/2".into(), &base * (f64::MAX / 2.0)),
        ("gaussian×1e-320 (subnormal)".into(), &base * 1e-320),
        ("with NaN".into(), with(f64::NAN)),
        ("with +inf".into(), with(f64::INFINITY)),
        ("with -inf".into(), with(f64::NEG_INFINITY)),
        ("zero".into(), Array2::zeros((rows, cols))),
        ("rank one".into(), rank_one),
        ("1×1".into(), Array2::from_elem((1, 1), 0.5)),
        ("0×cols".into(), Array2::zeros((0, cols))),
        ("rows×0".into(), Array2::zeros((rows, 0))),
        ("transposed shape".into(), gauss(cols + 1, rows + 1)),
    ]
}

/// How a matrix's values are laid out in memory: every layout a caller's `ArrayView2` can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Row-major, contiguous.
    Standard,
    /// Column-major (a transposed view of a row-major array).
    ColumnMajor,
    /// Every other row and column of a larger array (non-unit strides).
    Strided,
    /// Rows in reverse order through a negative row stride.
    RowReversed,
}

impl Layout {
    /// All layouts.
    pub const ALL: [Layout; 4] = [
        Layout::Standard,
        Layout::ColumnMajor,
        Layout::Strided,
        Layout::RowReversed,
    ];

    /// The values of `a` in this layout.
    pub fn lay_out(self, a: &Array2<f64>) -> LaidOut {
        let (r, c) = a.dim();
        let storage = match self {
            Layout::Standard => standard(a.view()),
            Layout::ColumnMajor => {
                let mut f = Array2::zeros((r, c).f());
                f.assign(a);
                f
            }
            Layout::Strided => {
                let mut big = Array2::from_elem((2 * r, 2 * c), f64::NAN);
                big.slice_mut(s![..;2, ..;2]).assign(a);
                big
            }
            Layout::RowReversed => standard(a.slice(s![..;-1, ..])),
        };
        LaidOut {
            layout: self,
            storage,
        }
    }
}

/// A row-major copy (`to_owned` keeps a view's memory order, negative strides included).
fn standard(a: ArrayView2<'_, f64>) -> Array2<f64> {
    Array2::from_shape_vec(a.dim(), a.iter().copied().collect())
        .expect("the element count matches the shape")
}

/// Storage that shows a matrix in a given [`Layout`] through [`LaidOut::view`].
#[derive(Clone, Debug)]
pub struct LaidOut {
    layout: Layout,
    storage: Array2<f64>,
}

impl LaidOut {
    /// The matrix, in its layout.
    pub fn view(&self) -> ArrayView2<'_, f64> {
        match self.layout {
            Layout::Standard | Layout::ColumnMajor => self.storage.view(),
            Layout::Strided => self.storage.slice(s![..;2, ..;2]),
            Layout::RowReversed => self.storage.slice(s![..;-1, ..]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_shows_the_same_values() {
        for (_, a) in matrices(7, 4, 3) {
            for layout in Layout::ALL {
                let laid = layout.lay_out(&a);
                let v = laid.view();
                assert_eq!(v.dim(), a.dim());
                for (x, y) in v.iter().zip(a.iter()) {
                    assert!(x == y || (x.is_nan() && y.is_nan()));
                }
            }
        }
    }

    #[test]
    fn layouts_have_the_strides_they_claim() {
        let a = Array2::from_shape_fn((3, 4), |(i, j)| (i * 4 + j) as f64);
        assert!(Layout::ColumnMajor
            .lay_out(&a)
            .view()
            .t()
            .is_standard_layout());
        assert_eq!(Layout::Strided.lay_out(&a).view().strides(), &[16, 2]);
        assert!(Layout::RowReversed.lay_out(&a).view().strides()[0] < 0);
    }

    #[test]
    fn fuzz_classifies_calls() {
        // The answers come with the default deadline (20 s): on a loaded machine a panic's
        // unwinding (with a backtrace captured) once took longer than a 200 ms deadline and
        // was reported as a hang. Only the hang has a short deadline, and it sleeps far past it.
        let mut fuzz = Fuzz::new("classify");
        assert!(fuzz.check("fine", || Ok(())));
        assert!(!fuzz.check("wrong", || Err("NaN".into())));
        assert!(!fuzz.check("panic", || panic!("boom")));
        let mut fuzz = Fuzz {
            deadline: Duration::from_millis(200),
            ..fuzz
        };
        assert!(!fuzz.check("hang", || {
            thread::sleep(Duration::from_secs(3600));
            Ok(())
        }));
        assert_eq!(fuzz.calls(), 4);
        let d = fuzz.defects();
        assert!(d[0].contains("wrong answer: NaN"), "{d:?}");
        assert!(d[1].contains("panic: boom"), "{d:?}");
        assert!(d[2].contains("hang"), "{d:?}");
    }
}
