//! A fused op applied to tensors outside candle's autograd, kept with the tensors its
//! backward pass reads, so that a caller can run that backward pass itself.
//!
//! candle's own backward pass gives each input of each node a zeroed buffer and adds the
//! node's gradient into it; a caller that knows its graph hands each gradient on as it is.
//! The inputs must not be tracked by autograd (detached, or not variables): the op then
//! records no graph, and its backward pass is exactly the one autograd would run.

use std::sync::Arc;

use candle_core::{CustomOp1, CustomOp2, CustomOp3, Result, Tensor};

/// The gradient an op's backward pass left out, named.
fn given(op: &str, grad: Option<Tensor>) -> Result<Tensor> {
    match grad {
        Some(grad) => Ok(grad),
        None => candle_core::bail!("{op} gave no gradient for one of its inputs"),
    }
}

/// A one-input op, its input and its output.
pub struct Applied1 {
    op: Arc<Box<dyn CustomOp1 + Send + Sync>>,
    input: Tensor,
    output: Tensor,
}

impl Applied1 {
    pub fn new(op: Box<dyn CustomOp1 + Send + Sync>, input: &Tensor) -> Result<Self> {
        let op = Arc::new(op);
        let input = input.contiguous()?;
        let output = input.apply_op1_arc(Arc::clone(&op))?;
        Ok(Applied1 { op, input, output })
    }

    pub fn output(&self) -> &Tensor {
        &self.output
    }

    /// The input's gradient from the output's.
    pub fn grad(&self, grad: &Tensor) -> Result<Tensor> {
        given(
            self.op.name(),
            self.op.bwd(&self.input, &self.output, grad)?,
        )
    }
}

/// A two-input op, its inputs and its output.
pub struct Applied2 {
    op: Arc<Box<dyn CustomOp2 + Send + Sync>>,
    inputs: [Tensor; 2],
    output: Tensor,
}

impl Applied2 {
    pub fn new(op: Box<dyn CustomOp2 + Send + Sync>, a: &Tensor, b: &Tensor) -> Result<Self> {
        let op = Arc::new(op);
        let (a, b) = (a.contiguous()?, b.contiguous()?);
        let output = a.apply_op2_arc(&b, Arc::clone(&op))?;
        Ok(Applied2 {
            op,
            inputs: [a, b],
            output,
        })
    }

    pub fn output(&self) -> &Tensor {
        &self.output
    }

    /// The inputs' gradients from the output's.
    pub fn grads(&self, grad: &Tensor) -> Result<(Tensor, Tensor)> {
        let [a, b] = &self.inputs;
        let (da, db) = self.op.bwd(a, b, &self.output, grad)?;
        Ok((given(self.op.name(), da)?, given(self.op.name(), db)?))
    }
}

/// A three-input op, its inputs and its output.
pub struct Applied3 {
    op: Arc<Box<dyn CustomOp3 + Send + Sync>>,
    inputs: [Tensor; 3],
    output: Tensor,
}

impl Applied3 {
    pub fn new(
        op: Box<dyn CustomOp3 + Send + Sync>,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
    ) -> Result<Self> {
        let op = Arc::new(op);
        let (a, b, c) = (a.contiguous()?, b.contiguous()?, c.contiguous()?);
        let output = a.apply_op3_arc(&b, &c, Arc::clone(&op))?;
        Ok(Applied3 {
            op,
            inputs: [a, b, c],
            output,
        })
    }

    pub fn output(&self) -> &Tensor {
        &self.output
    }

    /// The inputs' gradients from the output's.
    pub fn grads(&self, grad: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let [a, b, c] = &self.inputs;
        let (da, db, dc) = self.op.bwd(a, b, c, &self.output, grad)?;
        let name = self.op.name();
        Ok((given(name, da)?, given(name, db)?, given(name, dc)?))
    }
}
