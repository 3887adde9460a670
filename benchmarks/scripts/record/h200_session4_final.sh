R=$OUT/r; mkdir -p $R; S=benchmarks/scripts/h200_targets.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
timeout 100 python3 -m pytest -q -rs -n 4 -p no:cacheprovider tests/gpu/test_gpu_cp_layer.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_codec.py tests/gpu/test_gpu_snake_beta.py tests/gpu/test_gpu_dense_attention.py > $R/gpu_tests.txt 2>&1
tail -3 $R/gpu_tests.txt
if grep -q "FAILED tests/gpu/test_gpu_cp_layer\|FAILED tests/gpu/test_gpu_engine" $R/gpu_tests.txt || ! grep -q "passed" $R/gpu_tests.txt; then export VOXFLOW_CP_FUSED_LAYER=0; echo "cp fused layer OFF" | tee $R/cp_off.txt; fi
STAGE=http OUT=$R timeout 215 bash $S
STAGE=small OUT=$R timeout 135 bash $S
OFFICIAL_PROMPTS=1 STAGE=official OUT=$R timeout 130 bash $S
cd $OUT && tar czf res.tgz r && rm -rf r
