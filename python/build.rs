//! Compiles `src/bridge.cpp` (the torch.Tensor ↔ at::Tensor calls) against the libtorch that
//! torch-sys found, with the Python headers of the interpreter maturin builds for, and links
//! `torch_python` (loaded by `import torch` before the extension).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/bridge.cpp");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let libtorch = match env::var_os("LIBTORCH") {
        Some(dir) => PathBuf::from(dir),
        None => fail("LIBTORCH is not set: point it at the torch package directory of the venv"),
    };
    let lib = libtorch.join("lib");
    let include = libtorch.join("include");
    let python = env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let python_include = python_include(&python);
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include(python_include)
        .flag("-std=c++17")
        // The PyPI torch wheels are built with the C++11 ABI, as torch-sys assumes by default.
        .flag(format!(
            "-D_GLIBCXX_USE_CXX11_ABI={}",
            env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned())
        ))
        .file("src/bridge.cpp")
        .compile("kappa_bridge");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_python");
}

/// The C headers directory of `python` (`sysconfig.get_path("include")`).
fn python_include(python: &str) -> PathBuf {
    let out = Command::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('include'))",
        ])
        .output();
    match out {
        Ok(out) if out.status.success() => {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if dir.join("Python.h").is_file() {
                dir
            } else {
                fail(&format!(
                    "{} has no Python.h: install the interpreter's headers (Debian: python3-dev)",
                    dir.display()
                ))
            }
        }
        _ => fail(&format!(
            "could not run `{python}` to find the Python headers"
        )),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("kappa-python build: {message}");
    std::process::exit(1)
}
