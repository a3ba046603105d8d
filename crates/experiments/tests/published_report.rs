//! `docs/results/report.md`, the published report, is what `--publish` splices into: it reads
//! back section by section (markers intact), renders to the same text, and every plot it embeds
//! is there.

use kappa_experiments::report::Report;

#[test]
fn the_published_report_reads_back_and_its_plots_exist() {
    let path = &kappa_testkit::crate_dir().join("../../docs/results/report.md");
    let text = std::fs::read_to_string(path).unwrap();
    let report = Report::parse(&text).unwrap();
    assert!(!report.parts.is_empty());
    assert_eq!(
        report.render(),
        text,
        "rendered anew, the report would change"
    );
    let docs = path.parent().unwrap();
    for image in report.images(kappa_cli::EXPERIMENTS) {
        assert!(docs.join(image).is_file(), "{image} is missing");
    }
}
