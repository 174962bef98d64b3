//! A borrowed row-major `[rows, cols]` matrix, the shape every batch entry point takes.

use crate::error::{Error, Result};

/// A row-major matrix borrowed from the caller (a numpy array, a C buffer, a `Vec`).
#[derive(Clone, Copy, Debug)]
pub struct MatrixView<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
}

impl<'a, T> MatrixView<'a, T> {
    /// Wraps `data` as `[rows, cols]`; `argument` names it in the error if the length is wrong.
    pub fn new(argument: &'static str, data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(Error::value(
                argument,
                format!(
                    "has {} elements, which is not the shape [{rows}, {cols}]",
                    data.len()
                ),
            ));
        }
        Ok(MatrixView { data, rows, cols })
    }

    /// Number of rows (requests).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (draft positions).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// All elements, row-major.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// Row `row`.
    pub fn row(&self, row: usize) -> &'a [T] {
        &self.data[row * self.cols..(row + 1) * self.cols]
    }

    /// Fails unless the matrix has exactly `cols` columns.
    pub fn expect_cols(&self, argument: &'static str, cols: usize) -> Result<()> {
        if self.cols == cols {
            Ok(())
        } else {
            Err(Error::value(
                argument,
                format!(
                    "expected shape [R, {cols}], got [{}, {}]",
                    self.rows, self.cols
                ),
            ))
        }
    }

    /// Fails unless the matrix has exactly `rows` rows.
    pub fn expect_rows(&self, argument: &'static str, rows: usize) -> Result<()> {
        if self.rows == rows {
            Ok(())
        } else {
            Err(Error::value(
                argument,
                format!(
                    "expected {rows} rows to match the other arguments, got shape [{}, {}]",
                    self.rows, self.cols
                ),
            ))
        }
    }
}
