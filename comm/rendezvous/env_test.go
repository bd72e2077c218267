package rendezvous

import (
	"strings"
	"testing"
)

type envCase struct {
	name    string
	env     map[string]string
	want    Info
	wantErr string // substring of the error; "" for success
}

func runEnvCases(t *testing.T, cases []envCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromEnv(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("FromEnv(%v) = %+v, %v; want an error containing %q", tc.env, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromEnv(%v): %v", tc.env, err)
			}
			if got != tc.want {
				t.Fatalf("FromEnv(%v)\n got %+v\nwant %+v", tc.env, got, tc.want)
			}
		})
	}
}

func TestFromEnvSingle(t *testing.T) {
	runEnvCases(t, []envCase{
		{name: "nothing set", env: nil, want: Info{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, Source: "single"}},
		{name: "unrelated only", env: map[string]string{"MASTER_ADDR": "h", "SLURM_JOB_ID": "7"},
			want: Info{WorldSize: 1, LocalWorldSize: 1, Source: "single"}},
	})
}

func TestFromEnvAsynctp(t *testing.T) {
	full := map[string]string{"ASYNCTP_RANK": "5", "ASYNCTP_WORLD_SIZE": "8", "ASYNCTP_LOCAL_RANK": "1",
		"ASYNCTP_LOCAL_WORLD_SIZE": "4", "ASYNCTP_MASTER_ADDR": "10.0.0.1", "ASYNCTP_MASTER_PORT": "29400", "ASYNCTP_JOB_ID": "run7"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range full {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	want := Info{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, MasterAddr: "10.0.0.1", MasterPort: 29400, JobID: "run7", Source: "asynctp"}
	runEnvCases(t, []envCase{
		{name: "full", env: full, want: want},
		{name: "wins over torchrun and slurm", env: with("RANK", "0", "WORLD_SIZE", "2", "SLURM_PROCID", "1"), want: want},
		{name: "spaces trimmed", env: with("ASYNCTP_RANK", " 5 "), want: want},
		{name: "local defaults to one node", env: map[string]string{"ASYNCTP_RANK": "3", "ASYNCTP_WORLD_SIZE": "4",
			"ASYNCTP_MASTER_ADDR": "h", "ASYNCTP_MASTER_PORT": "1"},
			want: Info{Rank: 3, WorldSize: 4, LocalRank: 3, LocalWorldSize: 4, MasterAddr: "h", MasterPort: 1, Source: "asynctp"}},
		{name: "local rank from local world", env: with("ASYNCTP_LOCAL_RANK", ""),
			want: want}, // 5 % 4 = 1
		{name: "world of one needs no master", env: map[string]string{"ASYNCTP_RANK": "0", "ASYNCTP_WORLD_SIZE": "1"},
			want: Info{WorldSize: 1, LocalWorldSize: 1, Source: "asynctp"}},
		{name: "non-numeric rank", env: with("ASYNCTP_RANK", "five"), wantErr: `ASYNCTP_RANK="five" is not an integer`},
		{name: "non-numeric local size", env: with("ASYNCTP_LOCAL_WORLD_SIZE", "4x"), wantErr: `ASYNCTP_LOCAL_WORLD_SIZE="4x" is not an integer`},
		{name: "rank out of range", env: with("ASYNCTP_RANK", "8"), wantErr: "ASYNCTP_RANK=8 is out of range for ASYNCTP_WORLD_SIZE=8 (want 0..7)"},
		{name: "negative rank", env: with("ASYNCTP_RANK", "-1"), wantErr: "ASYNCTP_RANK=-1 is out of range"},
		{name: "zero world", env: with("ASYNCTP_RANK", "0", "ASYNCTP_WORLD_SIZE", "0"), wantErr: "ASYNCTP_WORLD_SIZE=0, want at least 1"},
		{name: "missing world", env: map[string]string{"ASYNCTP_RANK": "0"}, wantErr: "ASYNCTP_WORLD_SIZE is not set"},
		{name: "missing rank", env: map[string]string{"ASYNCTP_WORLD_SIZE": "2"}, wantErr: "ASYNCTP_RANK is not set"},
		{name: "local rank out of range", env: with("ASYNCTP_LOCAL_RANK", "4"), wantErr: "ASYNCTP_LOCAL_RANK=4 is out of range for ASYNCTP_LOCAL_WORLD_SIZE=4"},
		{name: "local world over world", env: with("ASYNCTP_LOCAL_WORLD_SIZE", "9"), wantErr: "ASYNCTP_LOCAL_WORLD_SIZE=9 is out of range for ASYNCTP_WORLD_SIZE=8"},
		{name: "missing master addr", env: with("ASYNCTP_MASTER_ADDR", ""), wantErr: "ASYNCTP_MASTER_ADDR is not set, but ASYNCTP_WORLD_SIZE=8"},
		{name: "missing master port", env: with("ASYNCTP_MASTER_PORT", ""), wantErr: "ASYNCTP_MASTER_PORT is not set"},
		{name: "bad port", env: with("ASYNCTP_MASTER_PORT", "70000"), wantErr: "ASYNCTP_MASTER_PORT=70000 is not a TCP port"},
		{name: "non-numeric port", env: with("ASYNCTP_MASTER_PORT", "http"), wantErr: `ASYNCTP_MASTER_PORT="http" is not an integer`},
	})
}

func TestFromEnvTorchrun(t *testing.T) {
	base := map[string]string{"RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
		"MASTER_ADDR": "node-a", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc"}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for key, val := range base {
			if key != k {
				m[key] = val
			}
		}
		return m
	}
	want := Info{Rank: 3, WorldSize: 16, LocalRank: 3, LocalWorldSize: 8, MasterAddr: "node-a", MasterPort: 29500, JobID: "abc", Source: "torchrun"}
	runEnvCases(t, []envCase{
		{name: "full", env: base, want: want},
		{name: "wins over slurm", env: with("SLURM_PROCID", "9"), want: want},
		{name: "wins over openmpi", env: with("OMPI_COMM_WORLD_RANK", "9"), want: want},
		{name: "non-numeric world", env: with("WORLD_SIZE", "sixteen"), wantErr: `WORLD_SIZE="sixteen" is not an integer`},
		{name: "rank out of range", env: with("RANK", "16"), wantErr: "RANK=16 is out of range for WORLD_SIZE=16"},
		{name: "local rank out of range", env: with("LOCAL_RANK", "8"), wantErr: "LOCAL_RANK=8 is out of range for LOCAL_WORLD_SIZE=8"},
		{name: "missing master", env: with("MASTER_ADDR", ""), wantErr: "torchrun environment: MASTER_ADDR is not set"},
		{name: "bad port", env: with("MASTER_PORT", "-5"), wantErr: "MASTER_PORT=-5 is not a TCP port"},
	})
}

func TestFromEnvSlurm(t *testing.T) {
	base := map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
		"SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[001-004,007],login1", "SLURM_JOB_ID": "12345"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	want := Info{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, MasterAddr: "gpu001",
		MasterPort: slurmPortBase + 12345%slurmPortSpan, JobID: "12345", Source: "slurm"}
	override := want
	override.MasterAddr, override.MasterPort = "10.1.1.1", 6000
	step := want
	step.MasterAddr = "gpu003"
	uneven := want
	uneven.Rank, uneven.LocalRank, uneven.LocalWorldSize, uneven.WorldSize = 9, 1, 3, 11
	noJob := want
	noJob.JobID, noJob.MasterPort = "", DefaultPort
	runEnvCases(t, []envCase{
		{name: "full", env: base, want: want},
		{name: "wins over openmpi", env: with("OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2"), want: want},
		{name: "MASTER_ADDR and MASTER_PORT override", env: with("MASTER_ADDR", "10.1.1.1", "MASTER_PORT", "6000"), want: override},
		{name: "step node list first", env: with("SLURM_STEP_NODELIST", "gpu[003-004]"), want: step},
		{name: "old SLURM_NODELIST", env: with("SLURM_JOB_NODELIST", "", "SLURM_NODELIST", "gpu001"), want: want},
		{name: "ntasks per node", env: with("SLURM_TASKS_PER_NODE", "", "SLURM_NTASKS_PER_NODE", "4"), want: want},
		{name: "step tasks first", env: with("SLURM_STEP_TASKS_PER_NODE", "4(x2)", "SLURM_TASKS_PER_NODE", "bogus"), want: want},
		{name: "uneven nodes", env: with("SLURM_PROCID", "9", "SLURM_NTASKS", "11", "SLURM_NODEID", "2", "SLURM_TASKS_PER_NODE", "4(x2),3"), want: uneven},
		{name: "SLURM_NPROCS", env: with("SLURM_NTASKS", "", "SLURM_NPROCS", "8"), want: want},
		{name: "no job id: default port", env: with("SLURM_JOB_ID", ""), want: noJob},
		{name: "one task, nothing else", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
			want: Info{WorldSize: 1, LocalWorldSize: 1, MasterPort: DefaultPort, Source: "slurm"}},
		{name: "non-numeric procid", env: with("SLURM_PROCID", "x"), wantErr: `SLURM_PROCID="x" is not an integer`},
		{name: "rank out of range", env: with("SLURM_PROCID", "8"), wantErr: "SLURM_PROCID=8 is out of range for SLURM_NTASKS=8"},
		{name: "missing ntasks", env: with("SLURM_NTASKS", ""), wantErr: "SLURM_NTASKS is not set"},
		{name: "bad tasks per node", env: with("SLURM_TASKS_PER_NODE", "4(x)"), wantErr: `SLURM_TASKS_PER_NODE: tasks per node "4(x)"`},
		{name: "several nodes, no node id", env: with("SLURM_NODEID", "", "SLURM_TASKS_PER_NODE", "4,4"), wantErr: "lists 2 nodes, but SLURM_NODEID is not set"},
		{name: "node id out of range", env: with("SLURM_NODEID", "2"), wantErr: "SLURM_NODEID=2 is out of range"},
		{name: "no tasks per node", env: with("SLURM_TASKS_PER_NODE", ""), wantErr: "tasks per node are unknown"},
		{name: "local id out of range", env: with("SLURM_LOCALID", "4"), wantErr: "SLURM_LOCALID=4 is out of range for SLURM_TASKS_PER_NODE=4"},
		{name: "bad node list", env: with("SLURM_JOB_NODELIST", "gpu[1-"), wantErr: "SLURM_JOB_NODELIST: node list \"gpu[1-\""},
		{name: "no node list", env: with("SLURM_JOB_NODELIST", ""), wantErr: "MASTER_ADDR (or SLURM_JOB_NODELIST) is not set"},
		{name: "bad MASTER_PORT", env: with("MASTER_PORT", "p"), wantErr: `MASTER_PORT="p" is not an integer`},
	})
}

func TestFromEnvOpenMPI(t *testing.T) {
	base := map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
		"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "head", "MASTER_PORT": "7000", "PMIX_NAMESPACE": "prterun-head-1@1"}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for key, val := range base {
			if key != k {
				m[key] = val
			}
		}
		return m
	}
	want := Info{Rank: 2, WorldSize: 4, LocalRank: 0, LocalWorldSize: 2, MasterAddr: "head", MasterPort: 7000, JobID: "prterun-head-1@1", Source: "openmpi"}
	noJob, older := want, want
	noJob.JobID, older.JobID = "", "42"
	runEnvCases(t, []envCase{
		{name: "full", env: base, want: want},
		{name: "no job id", env: with("PMIX_NAMESPACE", ""), want: noJob},
		{name: "Open MPI 4 job id", env: func() map[string]string {
			m := with("PMIX_NAMESPACE", "")
			m["OMPI_MCA_ess_base_jobid"] = "42"
			return m
		}(), want: older},
		{name: "non-numeric local size", env: with("OMPI_COMM_WORLD_LOCAL_SIZE", "two"), wantErr: `OMPI_COMM_WORLD_LOCAL_SIZE="two" is not an integer`},
		{name: "rank out of range", env: with("OMPI_COMM_WORLD_RANK", "4"), wantErr: "OMPI_COMM_WORLD_RANK=4 is out of range for OMPI_COMM_WORLD_SIZE=4"},
		{name: "missing size", env: with("OMPI_COMM_WORLD_SIZE", ""), wantErr: "OMPI_COMM_WORLD_SIZE is not set"},
		{name: "missing master", env: with("MASTER_ADDR", ""), wantErr: "openmpi environment: MASTER_ADDR is not set"},
		{name: "missing port", env: with("MASTER_PORT", ""), wantErr: "openmpi environment: MASTER_PORT is not set"},
	})
}

func TestInfoValidate(t *testing.T) {
	ok := Info{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "h", MasterPort: 1}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(%+v): %v", ok, err)
	}
	bad := ok
	bad.Rank = 2
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "Rank=2 is out of range for WorldSize=2") {
		t.Fatalf("Validate(%+v) = %v, want a Rank out of range error", bad, err)
	}
	if s := ok.String(); !strings.Contains(s, "rank 1/2") || !strings.Contains(s, "h:1") {
		t.Errorf("String() = %q", s)
	}
}
