//! How both binaries refuse flags: one line on stderr and exit code 2, the project's rule for
//! an invalid configuration, so that an operator reads the same shape whichever binary it was.

use std::process::ExitCode;

/// The exit code of an invalid configuration, in both binaries.
pub const EXIT_CONFIG: u8 = 2;

/// Parses the command line and environment into `F`. On `Err` the caller exits with the code
/// given: 0 after `--help` or `--version`, [`EXIT_CONFIG`] after printing
/// `<binary>: <clap's message>` as one line.
pub fn parse<F: clap::Parser>() -> Result<F, ExitCode> {
    parse_from(std::env::args_os())
}

/// [`parse`] from `args` (the first is the program's name).
pub fn parse_from<F: clap::Parser>(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<F, ExitCode> {
    F::try_parse_from(args).map_err(|e| {
        if !e.use_stderr() {
            // --help and --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        eprintln!("{}: {}", F::command().get_name(), one_line(&e));
        ExitCode::from(EXIT_CONFIG)
    })
}

/// clap's message up to its usage section, on one line (a missing flag is named on the line
/// after the message's start).
fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    message.join(" ").trim_start_matches("error: ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    #[command(name = "demo")]
    struct Flags {
        #[arg(long)]
        config: String,
        #[arg(long, default_value_t = 1)]
        slots: u32,
    }

    #[test]
    fn refusals_are_one_line_naming_the_flag() {
        let missing = Flags::try_parse_from(["demo"]).unwrap_err();
        assert_eq!(
            one_line(&missing),
            "the following required arguments were not provided: --config <CONFIG>"
        );
        let bad = Flags::try_parse_from(["demo", "--config", "c", "--slots", "x"]).unwrap_err();
        let line = one_line(&bad);
        assert!(
            line.starts_with("invalid value 'x' for '--slots <SLOTS>'"),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
    }
}
