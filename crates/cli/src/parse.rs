//! Parsing one argument group on its own: what a caller that embeds [`ReproduceArgs`] or
//! [`TrainArgs`] in a command of its own uses to check a command line (tests, scripts).
//!
//! [`ReproduceArgs`]: crate::ReproduceArgs
//! [`TrainArgs`]: crate::TrainArgs

use clap::{Args, Parser};

/// A command whose only arguments are `A`'s.
#[derive(Parser)]
struct Only<A: Args> {
    #[command(flatten)]
    args: A,
}

/// Parses `args` (without the program name) as `A` alone: clap's error, with its usage text,
/// for an unknown flag or a bad value.
///
/// ```
/// let args: kappa_cli::TrainArgs = kappa_cli::parse_args(["--config", "my.toml"]).unwrap();
/// assert_eq!(args.config, std::path::PathBuf::from("my.toml"));
/// assert!(kappa_cli::parse_args::<kappa_cli::TrainArgs, _, _>(["--seed", "1"]).is_err());
/// ```
pub fn parse_args<A, I, T>(args: I) -> Result<A, clap::Error>
where
    A: Args,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let program = std::iter::once(std::ffi::OsString::from("kappa"));
    Only::<A>::try_parse_from(program.chain(args.into_iter().map(Into::into))).map(|o| o.args)
}
