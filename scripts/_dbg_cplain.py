import torch, sys
from dsv4_decode.ops.topk import _cplain, decode_topk_ref
from dsv4_decode.utils import cluster
if len(sys.argv) > 1:  # no cluster check
    import dsv4_decode.utils.cluster as C
    src = open(_cplain.__file__).read().replace("    cluster.check_cluster(CTAS)\n", "")
    from dsv4_decode.utils.module_copy import load_source
    _cplain = load_source(src, "cp_nocheck", "dsv4_decode.ops.topk")
x = torch.randn(2, 262144, device="cuda").to(torch.bfloat16)
lens = torch.full((2,), 262144, dtype=torch.int32, device="cuda")
out = torch.full((2, 512), -7, dtype=torch.int32, device="cuda")
print("clusters", _cplain.launch(x.view(torch.int16), lens, out, 512))
torch.cuda.synchronize()
print("equal", torch.equal(out, decode_topk_ref(x, lens, 512)))
