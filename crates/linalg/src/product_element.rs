//! The element types faer multiplies for kappa's `product` module (f32, f64), as a sealed bound
//! of [`crate::Real`], so faer's traits stay out of kappa's API. A module of its own so that
//! `scalar` (which names the bound) and `product` (which uses `Real`) depend on it one way.

pub(crate) use element::ProductElement;

mod element {
    /// The element types faer multiplies for kappa (f32, f64); a bound of [`crate::Real`] that
    /// only this crate can name or implement.
    pub trait ProductElement: Copy + faer::traits::ComplexField {}
    impl ProductElement for f32 {}
    impl ProductElement for f64 {}
}
