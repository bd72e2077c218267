package cuda

// testPTX holds the kernels of the module tests, written by hand (no nvcc
// needed to build the tests). ptxas of CUDA 11.8 accepts it for sm_80; the
// driver JIT-compiles it for the GPU at hand.
const testPTX = `//
// Hand-written PTX for package cuda's tests. .target sm_80 with PTX ISA 7.0,
// so that the driver JIT-compiles it for any GPU from Ampere on.
//
.version 7.0
.target sm_80
.address_size 64

// add_scalar(float *x, float v, unsigned n): x[i] += v for every i < n.
.visible .entry add_scalar(
	.param .u64 add_scalar_x,
	.param .f32 add_scalar_v,
	.param .u32 add_scalar_n
)
{
	.reg .pred	%p<2>;
	.reg .b32	%r<6>;
	.reg .f32	%f<4>;
	.reg .b64	%rd<5>;

	ld.param.u64	%rd1, [add_scalar_x];
	ld.param.f32	%f1, [add_scalar_v];
	ld.param.u32	%r1, [add_scalar_n];
	mov.u32		%r2, %ctaid.x;
	mov.u32		%r3, %ntid.x;
	mov.u32		%r4, %tid.x;
	mad.lo.u32	%r5, %r2, %r3, %r4;
	setp.ge.u32	%p1, %r5, %r1;
	@%p1 bra	ADD_DONE;
	cvta.to.global.u64	%rd2, %rd1;
	mul.wide.u32	%rd3, %r5, 4;
	add.u64		%rd4, %rd2, %rd3;
	ld.global.f32	%f2, [%rd4];
	add.f32		%f3, %f2, %f1;
	st.global.f32	[%rd4], %f3;
ADD_DONE:
	ret;
}

// args_probe(u64 *out, int a, unsigned b, long long c, unsigned long long d,
// float e, double f, struct{u64 x, y} g): thread 0 stores each argument's
// bits as a 64-bit word: out = {a (sign-extended), b, c, d, bits(e),
// bits(f), g.x, g.y}.
.visible .entry args_probe(
	.param .u64 args_probe_out,
	.param .s32 args_probe_a,
	.param .u32 args_probe_b,
	.param .s64 args_probe_c,
	.param .u64 args_probe_d,
	.param .f32 args_probe_e,
	.param .f64 args_probe_f,
	.param .align 16 .b8 args_probe_g[16]
)
{
	.reg .pred	%p<2>;
	.reg .b32	%r<5>;
	.reg .f32	%f<2>;
	.reg .f64	%fd<2>;
	.reg .b64	%rd<12>;

	mov.u32		%r1, %tid.x;
	mov.u32		%r2, %ctaid.x;
	or.b32		%r3, %r1, %r2;
	setp.ne.u32	%p1, %r3, 0;
	@%p1 bra	PROBE_DONE;
	ld.param.u64	%rd1, [args_probe_out];
	cvta.to.global.u64	%rd1, %rd1;
	ld.param.s32	%r4, [args_probe_a];
	cvt.s64.s32	%rd2, %r4;
	st.global.u64	[%rd1], %rd2;
	ld.param.u32	%r4, [args_probe_b];
	cvt.u64.u32	%rd3, %r4;
	st.global.u64	[%rd1+8], %rd3;
	ld.param.s64	%rd4, [args_probe_c];
	st.global.u64	[%rd1+16], %rd4;
	ld.param.u64	%rd5, [args_probe_d];
	st.global.u64	[%rd1+24], %rd5;
	ld.param.f32	%f1, [args_probe_e];
	mov.b32		%r4, %f1;
	cvt.u64.u32	%rd6, %r4;
	st.global.u64	[%rd1+32], %rd6;
	ld.param.f64	%fd1, [args_probe_f];
	mov.b64		%rd7, %fd1;
	st.global.u64	[%rd1+40], %rd7;
	ld.param.u64	%rd8, [args_probe_g];
	st.global.u64	[%rd1+48], %rd8;
	ld.param.u64	%rd9, [args_probe_g+8];
	st.global.u64	[%rd1+56], %rd9;
PROBE_DONE:
	ret;
}
`
