# EKS with a private API endpoint, secrets encryption and control-plane logs; node groups: a small
# CPU system group (operator, MLflow, Ray head), a CPU worker group (parsing actors, trial drivers)
# and GPU groups, the worker groups starting from zero and tagged so cluster-autoscaler can scale
# them up from zero; the VPC CNI add-on with network-policy enforcement; IRSA roles for Ray, MLflow
# and cluster-autoscaler.
resource "aws_iam_role" "cluster" {
  name = "${var.name}-eks-cluster"
  assume_role_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = [{ Effect = "Allow", Principal = { Service = "eks.amazonaws.com" }, Action = "sts:AssumeRole" }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "cluster" {
  role       = aws_iam_role.cluster.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"
}

resource "aws_eks_cluster" "this" {
  name     = var.name
  version  = var.kubernetes_version
  role_arn = aws_iam_role.cluster.arn

  vpc_config {
    subnet_ids              = var.private_subnet_ids
    endpoint_private_access = true
    endpoint_public_access  = length(var.public_api_cidrs) > 0
    public_access_cidrs     = var.public_api_cidrs
  }

  encryption_config {
    provider {
      key_arn = var.kms_key_arn
    }
    resources = ["secrets"]
  }

  enabled_cluster_log_types = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
  tags                      = var.tags
  depends_on                = [aws_iam_role_policy_attachment.cluster]
}

resource "aws_iam_role" "node" {
  name = "${var.name}-eks-node"
  assume_role_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = [{ Effect = "Allow", Principal = { Service = "ec2.amazonaws.com" }, Action = "sts:AssumeRole" }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "node" {
  for_each = toset([
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
  ])
  role       = aws_iam_role.node.name
  policy_arn = each.value
}

resource "aws_eks_node_group" "system" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "system"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.private_subnet_ids
  instance_types  = [var.system_instance_type]
  scaling_config {
    min_size     = 1
    desired_size = 2
    max_size     = 3
  }
  labels     = { "sieve/role" = "system" }
  tags       = var.tags
  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_eks_node_group" "gpu" {
  for_each        = var.gpu_node_groups
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "gpu-${each.key}"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.private_subnet_ids
  instance_types  = each.value.instance_types
  capacity_type   = each.value.spot ? "SPOT" : "ON_DEMAND"
  ami_type        = "AL2023_x86_64_NVIDIA"
  scaling_config {
    min_size     = each.value.min_size
    desired_size = each.value.min_size
    max_size     = each.value.max_size
  }
  labels = { "sieve/role" = "gpu", "sieve/gpu-group" = each.key }
  lifecycle {
    ignore_changes = [scaling_config[0].desired_size] # cluster-autoscaler owns it
  }
  taint {
    key    = "nvidia.com/gpu"
    value  = "present"
    effect = "NO_SCHEDULE"
  }
  tags       = var.tags
  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_eks_node_group" "cpu" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "cpu"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.private_subnet_ids
  instance_types  = var.cpu_node_group.instance_types
  capacity_type   = var.cpu_node_group.spot ? "SPOT" : "ON_DEMAND"
  scaling_config {
    min_size     = var.cpu_node_group.min_size
    desired_size = var.cpu_node_group.min_size
    max_size     = var.cpu_node_group.max_size
  }
  labels = { "sieve/role" = "cpu" }
  lifecycle {
    ignore_changes = [scaling_config[0].desired_size] # cluster-autoscaler owns it
  }
  tags       = var.tags
  depends_on = [aws_iam_role_policy_attachment.node]
}

# Scale from zero: with no node running, cluster-autoscaler learns what a group would offer (GPUs,
# labels, taints) from these tags on the group's Auto Scaling group. EKS does not copy node-group
# labels, taints or extended resources to the ASG, so they are set here.
locals {
  gpu_asg_tags = merge([for name, g in var.gpu_node_groups : {
    "${name}/gpu"   = { asg = aws_eks_node_group.gpu[name].resources[0].autoscaling_groups[0].name, key = "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu", value = tostring(g.gpus_per_node) }
    "${name}/role"  = { asg = aws_eks_node_group.gpu[name].resources[0].autoscaling_groups[0].name, key = "k8s.io/cluster-autoscaler/node-template/label/sieve/role", value = "gpu" }
    "${name}/group" = { asg = aws_eks_node_group.gpu[name].resources[0].autoscaling_groups[0].name, key = "k8s.io/cluster-autoscaler/node-template/label/sieve/gpu-group", value = name }
    "${name}/taint" = { asg = aws_eks_node_group.gpu[name].resources[0].autoscaling_groups[0].name, key = "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu", value = "present:NoSchedule" }
  }]...)
  cpu_asg_tags = {
    "cpu/role" = { asg = aws_eks_node_group.cpu.resources[0].autoscaling_groups[0].name, key = "k8s.io/cluster-autoscaler/node-template/label/sieve/role", value = "cpu" }
  }
}

resource "aws_autoscaling_group_tag" "scale_from_zero" {
  for_each               = merge(local.gpu_asg_tags, local.cpu_asg_tags)
  autoscaling_group_name = each.value.asg
  tag {
    key                 = each.value.key
    value               = each.value.value
    propagate_at_launch = false
  }
}

# NetworkPolicies are enforced by the VPC CNI's network-policy agent, switched on here; without it
# (or Calico/Cilium) Kubernetes accepts NetworkPolicy objects and enforces nothing.
resource "aws_eks_addon" "vpc_cni" {
  cluster_name                = aws_eks_cluster.this.name
  addon_name                  = "vpc-cni"
  addon_version               = var.vpc_cni_version
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "OVERWRITE"
  configuration_values        = jsonencode({ enableNetworkPolicy = "true" })
  tags                        = var.tags
}

# IRSA: the cluster's OIDC provider, and one role per workload service account.
resource "aws_iam_openid_connect_provider" "this" {
  url            = aws_eks_cluster.this.identity[0].oidc[0].issuer
  client_id_list = ["sts.amazonaws.com"]
  # thumbprint_list omitted: IAM trusts the EKS OIDC issuer's certificate authority itself.
  tags = var.tags
}

locals {
  oidc_host = replace(aws_iam_openid_connect_provider.this.url, "https://", "")
  service_accounts = {
    ray                = "system:serviceaccount:${var.namespace}:ray"
    mlflow             = "system:serviceaccount:${var.namespace}:mlflow"
    cluster-autoscaler = "system:serviceaccount:kube-system:cluster-autoscaler"
  }
  # Bucket access by workload: read-write prefixes, read-only prefixes. Source models and raw
  # corpora are read-only to jobs; MLflow artifacts are written by the MLflow server only.
  bucket_workloads = { for k, v in var.bucket_access : k => v if length(v.read_write) + length(v.read_only) > 0 }
}

resource "aws_iam_role" "workload" {
  for_each = local.service_accounts
  name     = "${var.name}-${each.key}"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Federated = aws_iam_openid_connect_provider.this.arn }
      Action    = "sts:AssumeRoleWithWebIdentity"
      Condition = { StringEquals = { "${local.oidc_host}:sub" = each.value, "${local.oidc_host}:aud" = "sts.amazonaws.com" } }
    }]
  })
  tags = var.tags
}

# Least privilege: each workload lists, reads and writes only its own prefixes of the project bucket.
# s3:ListBucket is conditioned on a prefix, so code must list a prefix (never HeadBucket the bucket):
# orchestrator.storage.check_access does, and tests/infra checks the pair.
resource "aws_iam_role_policy" "bucket" {
  for_each = local.bucket_workloads
  role     = aws_iam_role.workload[each.key].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat(
      [{
        Effect    = "Allow"
        Action    = ["s3:ListBucket"]
        Resource  = var.bucket_arn
        Condition = { StringLike = { "s3:prefix" = concat(each.value.read_write, each.value.read_only) } }
      }],
      length(each.value.read_write) == 0 ? [] : [{
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
        Resource = [for p in each.value.read_write : "${var.bucket_arn}/${p}"]
      }],
      length(each.value.read_only) == 0 ? [] : [{
        Effect   = "Allow"
        Action   = ["s3:GetObject"]
        Resource = [for p in each.value.read_only : "${var.bucket_arn}/${p}"]
      }],
      [{
        Effect   = "Allow"
        Action   = length(each.value.read_write) == 0 ? ["kms:Decrypt"] : ["kms:Decrypt", "kms:GenerateDataKey"]
        Resource = var.kms_key_arn
      }]
    )
  })
}

# cluster-autoscaler: describe everything, change only the node groups of this cluster: ASGs EKS
# made for it (named eks-*, tagged k8s.io/cluster-autoscaler/<cluster> = owned by EKS).
data "aws_partition" "this" {}
data "aws_region" "this" {}
data "aws_caller_identity" "this" {}

locals {
  arn_prefix = "arn:${data.aws_partition.this.partition}"
  account    = data.aws_caller_identity.this.account_id
}

resource "aws_iam_role_policy" "cluster_autoscaler" {
  role = aws_iam_role.workload["cluster-autoscaler"].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect = "Allow"
        Action = ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
          "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
          "autoscaling:DescribeTags", "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
        "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements"]
        Resource = "*" # Describe* calls cannot be scoped to a resource
      },
      {
        Effect   = "Allow"
        Action   = ["eks:DescribeNodegroup"]
        Resource = "${local.arn_prefix}:eks:${data.aws_region.this.name}:${local.account}:nodegroup/${aws_eks_cluster.this.name}/*/*"
      },
      {
        Effect    = "Allow"
        Action    = ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"]
        Resource  = "${local.arn_prefix}:autoscaling:${data.aws_region.this.name}:${local.account}:autoScalingGroup:*:autoScalingGroupName/eks-*"
        Condition = { StringEquals = { "aws:ResourceTag/k8s.io/cluster-autoscaler/${aws_eks_cluster.this.name}" = "owned" } }
      }
    ]
  })
}
