variable "name" {
  type        = string
  description = "Prefix for every resource name."
}

variable "cidr_block" {
  type        = string
  description = "CIDR of the VPC."
  default     = "10.40.0.0/16"
  validation {
    condition     = can(cidrhost(var.cidr_block, 0))
    error_message = "cidr_block must be a valid IPv4 CIDR."
  }
}

variable "az_count" {
  type        = number
  description = "Number of availability zones (one private + one public subnet and a NAT gateway each)."
  default     = 2
  validation {
    condition     = var.az_count >= 2 && var.az_count <= 4
    error_message = "az_count must be between 2 and 4 (EKS needs two zones)."
  }
}

variable "kms_key_arn" {
  type        = string
  description = "KMS key that encrypts the flow-log group."
}

variable "tags" {
  type        = map(string)
  description = "Tags applied to every resource."
  default     = {}
}
